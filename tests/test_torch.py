"""The PyTorch integration: tensors on the ring's memory, device passthrough on CPU, the
pin_memory paths, and the examples (the module's and the training script)."""

import doctest
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import assert_tree_equal, copy_tree  # noqa: E402

import fastload.torch as fltorch  # noqa: E402
from fastload import DataLoader, mapobs  # noqa: E402
from fastload.torch import TorchLoader, to_device  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data(n=50):
    x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    return {"x": x, "y": np.arange(n, dtype=np.int64), "z": mapobs(lambda v: v * 2, x)}


def _loader(**kw):
    options = dict(batch_size=8, shuffle=True, seed=1, parallel=2, buffer=True)
    options.update(kw)
    return DataLoader(_data(), **options)


def test_import_fastload_does_not_import_torch():
    code = (
        "import sys, fastload; assert 'torch' not in sys.modules; assert 'jax' not in sys.modules"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}
    )


def test_tensors_share_memory_with_the_ring_and_equal_numpy_batches():
    arrays, tensors = _loader(), TorchLoader(_loader())
    for batch, tensor_batch in zip(arrays, tensors):
        for key in ("x", "y", "z"):
            tensor, array = tensor_batch[key], batch[key]
            assert isinstance(tensor, torch.Tensor)
            np.testing.assert_array_equal(tensor.numpy(), array)
        assert tensor_batch["x"].data_ptr() in _ring_addresses(tensors.loader)


def _ring_addresses(loader):
    """The addresses of the ring's arrays (no reference to them is kept: the loader would
    take it for a batch kept past its validity)."""
    ring = [leaf for slot in loader._engine.ring for leaf in slot]
    return {
        a.ctypes.data
        for part in ring
        for a in (part.values() if isinstance(part, dict) else [part])
    }


def test_tensor_is_the_yielded_array_without_a_copy():
    array = np.arange(12.0).reshape(3, 4)
    tensor = fltorch._tensors({"a": (array, [array]), "s": "text"})
    assert tensor["a"][0].data_ptr() == array.ctypes.data
    assert tensor["a"][1][0].data_ptr() == array.ctypes.data
    assert tensor["s"] == "text"


def test_loader_passthroughs():
    loader = _loader()
    wrapped = TorchLoader(loader)
    assert len(wrapped) == len(loader)
    it = iter(wrapped)
    next(it)
    state = wrapped.state_dict()
    assert state == loader.state_dict() and state["step"] == 1
    # Buffered batches are copied as they come: a slot is reused once the next is asked for.
    rest = [{k: v.numpy().copy() for k, v in b.items()} for b in it]
    again = TorchLoader(_loader())
    again.load_state_dict(state)
    assert_tree_equal([{k: v.numpy().copy() for k, v in b.items()} for b in again], rest)
    assert wrapped.stats()["batches"] == len(loader)


def test_to_device_cpu_passes_batches_through():
    loader = TorchLoader(_loader())
    moved = to_device(loader, "cpu")
    assert len(moved) == len(loader)
    for batch in moved:
        assert batch["x"].device.type == "cpu"
        ring = loader.loader._engine.ring
        assert any(batch["x"].data_ptr() == slot[0].ctypes.data for slot in ring)


def test_to_device_takes_a_plain_loader_and_tuples():
    loader = DataLoader((np.arange(10.0), np.arange(10)), batch_size=4)
    batches = list(to_device(loader, "cpu"))
    assert [tuple(type(t) for t in b) for b in batches] == [(torch.Tensor, torch.Tensor)] * 3
    assert torch.equal(batches[-1][0], torch.tensor([8.0, 9.0], dtype=torch.float64))


def test_pin_memory_without_cuda_warns_once_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU machine
    monkeypatch.setattr(fltorch, "_warned_no_cuda", False)
    loader = _loader()
    with pytest.warns(UserWarning, match="CUDA is not available"):
        TorchLoader(loader, pin_memory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TorchLoader(_loader(), pin_memory=True)
    assert loader._engine.allocator is np.empty
    assert sum(1 for _ in TorchLoader(loader)) == len(loader)


@pytest.mark.parametrize(
    "kw, message", [({"buffer": False}, "buffer=True"), ({"backend": "process"}, "thread backend")]
)
def test_pin_memory_says_what_it_needs(kw, message):
    with pytest.raises(ValueError, match=message):
        TorchLoader(_loader(**kw), pin_memory=True)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the pinned ring's side-stream copies run on a GPU only; "
    "run on a machine with one to check them",
)
def test_pinned_ring_and_cuda_prefetch_match_the_cpu_batches():
    expected = [copy_tree(b) for b in _loader()]
    loader = TorchLoader(_loader(), pin_memory=True)
    got = [{k: v.cpu().numpy() for k, v in b.items()} for b in to_device(loader, "cuda")]
    assert_tree_equal(got, expected)
    assert all(
        leaf.is_pinned()
        for slot in loader.loader._engine.ring
        for leaf in map(torch.from_numpy, slot[:2])
    )


@pytest.mark.slow
def test_the_module_docstring_example_runs_on_generated_data():
    images = np.random.default_rng(0).random((100, 3, 8, 8), dtype=np.float32)
    data = (images, np.arange(100) % 10)
    seen = []

    def model(images, labels):
        assert isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)
        seen.append(len(images))
        return images.mean()

    example = doctest.DocTestParser().get_doctest(
        fltorch.__doc__, {"data": data, "model": model}, "fastload.torch", fltorch.__file__, 0
    )
    report = []
    result = doctest.DocTestRunner().run(example, out=report.append)
    assert result.attempted == 7 and result.failed == 0, "".join(report)
    assert seen == [64, 36]


def test_the_training_example_runs_and_its_loss_decreases():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_torch.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.stderr
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", result.stdout)]
    assert len(losses) >= 4
    assert np.mean(losses[-2:]) < np.mean(losses[:2])
    assert "accuracy" in result.stdout and "items/s, waited for data" in result.stdout


_KEPT = "still referenced when its memory is about to be reused"


def _tensor_memory(shape, dtype):
    """What the pinned ring's allocator makes, in pageable memory: an array on a tensor's."""
    torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
    return torch.empty(tuple(shape), dtype=torch_dtype).numpy()


@pytest.mark.parametrize("pinned", [False, True])
def test_tensors_kept_from_a_buffered_torch_loader_are_warned_of(pinned, monkeypatch):
    loader = _loader()
    if pinned:  # the pin_memory=True path, on a machine without CUDA
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(fltorch, "_pinned_empty", _tensor_memory)
    tensors = TorchLoader(loader, pin_memory=pinned)
    kept = []
    with pytest.warns(RuntimeWarning, match=_KEPT):
        for batch in tensors:
            kept.append(batch["x"])
    assert (loader.allocator is _tensor_memory) == pinned


@pytest.mark.parametrize("pinned", [False, True])
def test_a_torch_loop_that_keeps_nothing_is_not_warned_of(pinned, monkeypatch):
    if pinned:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(fltorch, "_pinned_empty", _tensor_memory)
    tensors = TorchLoader(_loader(), pin_memory=pinned)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            for batch in tensors:
                total = batch["x"].sum() + batch["z"].float().mean()
            for batch in to_device(tensors, "cpu"):
                total = total + batch["y"].sum()
