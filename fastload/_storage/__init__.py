"""The packed format's machinery behind ``fastload.storage``: encodings, checksums,
file maps and their guards, the Arrow IPC framing, encoder threads and processes,
reading ahead; and the tar files (plain or compressed) that ``fastload.streams`` reads.
Nothing here is imported by users."""
