"""The memory this process may use: the limit of its memory cgroup, else physical RAM.

A packed file larger than this cannot stay in the page cache, so a random order reads it
from disk again and again; ``memory_limit`` is what the loader compares file sizes with.
Both cgroup versions are read: v1 (``memory.limit_in_bytes``) and v2 (``memory.max``),
of the process's own cgroup (``/proc/self/cgroup``) and of every cgroup above it, since a
parent's limit binds its children too.
"""

import os

__all__ = ["memory_limit"]

_UNLIMITED = 1 << 60  # v1 writes "no limit" as a huge number (2^63 rounded to pages)


def memory_limit():
    """Bytes of memory this process may use: the smallest of physical RAM and the limits
    of its memory cgroup and the cgroups above it (Linux; elsewhere RAM, or None when the
    platform does not say)."""
    limits = [_physical_memory()] + _cgroup_limits()
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_limits(cgroup="/proc/self/cgroup", mountinfo="/proc/self/mountinfo"):
    """The memory limits of this process's cgroup and its ancestors (bytes), v1 and v2:
    ``cgroup`` lists the process's cgroups, ``mountinfo`` where their file systems are."""
    try:
        with open(cgroup) as f:
            lines = f.read().splitlines()
        with open(mountinfo) as f:
            mounts = f.read().splitlines()
    except OSError:
        return []
    limits = []
    for line in lines:
        if line.count(":") < 2:
            continue
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            limits += _limits_under(_mount_of(mounts, "cgroup2", None), path, "memory.max")
        elif "memory" in controllers.split(","):
            limits += _limits_under(
                _mount_of(mounts, "cgroup", "memory"), path, "memory.limit_in_bytes"
            )
    return limits


def _mount_of(mounts, fstype, controller):
    """(mount point, root within the hierarchy) of the cgroup file system ``fstype``
    (with ``controller`` among its options for v1), or None."""
    for line in mounts:
        fields = line.split()
        if " - " not in line:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3 or after[0] != fstype:
            continue
        if controller is not None and controller not in after[2].split(","):
            continue
        return fields[4], fields[3]
    return None


def _limits_under(mount, path, name):
    """The values of file ``name`` in the cgroup ``path`` and its ancestors, up to the
    mount point; "max" and v1's "no limit" are left out."""
    if mount is None:
        return []
    point, root = mount
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    parts = [p for p in path.split("/") if p]
    limits = []
    for depth in range(len(parts), -1, -1):
        value = _read_limit(os.path.join(point, *parts[:depth], name))
        if value is not None:
            limits.append(value)
    return limits


def _read_limit(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max": no limit
    value = int(text)
    return value if value < _UNLIMITED else None
