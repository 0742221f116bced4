"""Built-in task generators (no files needed). Each module registers its tasks on import."""
