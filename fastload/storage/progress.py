"""A tqdm progress bar when one is asked for and tqdm is installed (an optional extra)."""

__all__ = ["progress_bar"]


def progress_bar(total, enabled, unit, desc):
    """A tqdm bar over ``total`` steps, or None when not ``enabled`` or tqdm is missing."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit=unit, desc=desc)
