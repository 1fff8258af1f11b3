"""Labelled images: loading splits (embedded, save_to_disk, imagefolder, hub), label mapping, seeded subsets.

Subsets are stored as row numbers and labels (`prepare`) and their images streamed batch by batch (`stream`,
with a uint8 cache in `image_cache`). It may import `runtimes` and `models` (the embedded digits dataset lives
there) and the top-level helpers.
"""
