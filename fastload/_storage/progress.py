"""A tqdm progress bar when one is asked for (tqdm is a dependency; it is imported only
then, so that ``import fastload`` stays light)."""

__all__ = ["progress_bar"]


def progress_bar(total, enabled, unit, desc):
    """A tqdm bar over ``total`` steps, or None when not ``enabled``."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=unit, desc=desc)
