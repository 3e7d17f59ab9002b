"""Every Python code block of README.md and docs/*.md runs, in order, as a reader would
paste it.

The blocks of one page run one after the other in one fresh interpreter, with nothing
defined beforehand: a block uses only what it or an earlier block of its page defines.
README.md starts in an empty folder and makes the images it reads itself (its block that
makes ``data/train``); a page of docs/ starts in a folder where that README block ran, as
the pages say.
"""

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
IMAGES_MADE = 'os.makedirs(f"data/train/'  # README's block that makes the example images


def python_blocks(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return BLOCK.findall(f.read())


def run_blocks(blocks, name, folder):
    """Runs ``blocks`` one after the other in a fresh interpreter in ``folder``; fails
    with the interpreter's error output when one raises."""
    script = folder.parent / f"{name}_blocks.py"
    script.write_text("".join(f"\n# {name}, block {k + 1}\n{b}" for k, b in enumerate(blocks)))
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, f"{name}: a block failed\n{result.stderr[-4000:]}"


def test_the_pages_have_python_blocks_to_run():
    assert len(python_blocks("README.md")) >= 8
    assert all(python_blocks(page) for page in PAGES if page != "docs/architecture.md")


def test_the_readme_makes_the_images_its_examples_read():
    [making] = [b for b in python_blocks("README.md") if IMAGES_MADE in b]
    first_use = next(k for k, b in enumerate(python_blocks("README.md")) if "data/train" in b)
    assert python_blocks("README.md")[first_use] == making


# Pages whose blocks start engines (Ray, Dask's cluster, Spark): run by make cluster.
CLUSTER_PAGES = {"docs/cluster.md"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.cluster) if p in CLUSTER_PAGES else p for p in PAGES],
)
def test_every_python_block_of_the_page_runs(page, tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    if page != "README.md":
        [making] = [b for b in python_blocks("README.md") if IMAGES_MADE in b]
        run_blocks([making], "README_images", folder)
    run_blocks(python_blocks(page), page.replace("/", "_").removesuffix(".md"), folder)
