# The compiled module fastload._jpeg (fastload/_jpeg.pyx), built where libjpeg is found.
from typing import Final

CAPSULE_NAME: Final[str]

def library_version() -> int: ...
def decoder() -> object: ...
