"""Labelled images: loading splits (embedded, save_to_disk, imagefolder, hub), label mapping, seeded subsets.

It may import `models` (the embedded digits dataset lives there) and the top-level helpers.
"""
