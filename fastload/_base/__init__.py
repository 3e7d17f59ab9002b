"""The shared helpers under the rest of fastload: the storage protocols (``protocols``),
nested structures (``tree``), the random streams (``randomness``), checks of option values
and of renamed names (``arguments``), refused keywords (``keywords``), the process toolkit
(``children``), collation (``collate``) and the version (``version``). Nothing here
imports a module of fastload but these and the leaves (``errors``, ``tensors``, ...), as
tests/test_architecture.py checks. Nothing here is imported by users."""
