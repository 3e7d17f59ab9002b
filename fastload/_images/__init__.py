"""Image code behind the transforms: codecs, image sources, batch mixes, and the
image encodings of packed datasets. Nothing here is imported by users."""
