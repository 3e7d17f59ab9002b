"""Every Python code block of README.md and docs/*.md runs, in order, on generated data.

The blocks of one page run one after the other in one fresh process (a later block may
use what an earlier one made, as a reader would), in a folder holding generated JPEGs at
the paths the examples name. What a reader brings (a model, a train step, texts) is a
small stand-in defined before the first block.
"""

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

STAND_INS = """\
import numpy as np
import simplejpeg
_rng = np.random.default_rng(0)
model = lambda images: images                          # what the reader trains
loss_fn = lambda outputs, labels: 0.0
train_step = lambda *args: 0.0
state = None
epochs = 1
texts = [f"text number {k}" for k in range(100)]
jpeg_bytes = [simplejpeg.encode_jpeg(_rng.integers(0, 255, (60, 80, 3), np.uint8))
              for _ in range(12)]
labels = np.arange(12)
data = {"image": _rng.integers(0, 255, (12, 60, 80, 3), np.uint8), "label": np.arange(12)}
"""


def python_blocks(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return BLOCK.findall(f.read())


def _image_folder(root, classes=("cat", "dog"), per_class=6):
    """Generated JPEGs in class folders, and ``train.csv`` beside ``root`` listing them."""
    rng = np.random.default_rng(1)
    rows = []
    for label, name in enumerate(classes):
        os.makedirs(os.path.join(root, name))
        for k in range(per_class):
            image = rng.integers(0, 255, (48 + 8 * k, 64, 3), np.uint8)
            path = os.path.join(root, name, f"{k}.jpg")
            with open(path, "wb") as f:
                f.write(simplejpeg.encode_jpeg(image, quality=85))
            rows.append(f"{path},{label}\n")
    with open(os.path.join(os.path.dirname(os.path.dirname(root)), "train.csv"), "w") as f:
        f.writelines(rows)


def test_the_pages_have_python_blocks_to_run():
    assert len(python_blocks("README.md")) >= 8
    assert all(python_blocks(page) for page in PAGES if page != "docs/architecture.md")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page, tmp_path):
    blocks = python_blocks(page)
    for folder in ("data/train", "imagenet/train"):
        _image_folder(tmp_path / folder)
    script = tmp_path / (page.replace("/", "_").replace(".md", "") + "_blocks.py")
    script.write_text(
        STAND_INS + "".join(f"\n# {page}, block {k + 1}\n{block}" for k, block in enumerate(blocks))
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, f"{page}: a block failed\n{result.stderr[-4000:]}"
