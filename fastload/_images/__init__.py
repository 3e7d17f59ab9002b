"""Image code under the public modules, which users reach through them, never directly:

- ``codecs``: decoding in Python where C does not (simplejpeg without libjpeg, Pillow for
  PNG and the other formats), format sniffing, and which decoder the build uses
  (``fastload.build_info``);
- ``imagesources``: whether and how the planner loads ``mapobs(Compose([...]), images)``
  in C (the ``_core.ImageSource`` of a view);
- ``chains``: what the image sources read of a chain of transforms (``Compose``), so that
  they need not import the transforms;
- ``mixing``: the batch mixes ``MixUp`` and ``CutMix`` (``fastload.transforms``);
- ``encoding``: the pixel work of the packed datasets' image encodings and ``convert``
  (decoding file bytes, fitting a size, area resize).
"""
