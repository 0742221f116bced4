"""Loaders for official on-disk dataset formats. Each module registers its tasks on import."""
