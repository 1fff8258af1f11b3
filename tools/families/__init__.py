"""Family adapters (ViT, DeiT, Swin, ResNet, generic) and the registry that picks one for a model."""
