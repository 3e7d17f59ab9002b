"""Writes in parts without an engine (``fastload.storage.parts``, the core that the engines
of ``fastload.cluster`` run): part files per partition and attempt, the manifest that
commits them, what ``open`` makes of a prefix with and without it, ``clean``, and the
same at moto's S3 server. The committed dataset equals ``fastload.write`` of the same
rows, byte for byte."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from partsets import FIELDS, assert_same_as_write, make_rows, s3_fixture, split

import fastload
from fastload import LoadError
from fastload.__main__ import main
from fastload.cluster import PartitionError, clean, commit, prepare, write_part
from fastload.storage import Bytes
from fastload.storage.parts import PartWrite, engine_error

MANIFEST = "_fastload_manifest.json"
ROWS = make_rows(120)


def _write(prefix, partitions, **kw):
    prepare(prefix, kw.get("storage_options"))
    return [write_part(rows, p, prefix, FIELDS, **kw) for p, rows in enumerate(partitions)]


def test_a_committed_write_in_parts_is_the_dataset_write_gives(tmp_path):
    prefix = str(tmp_path / "out")
    parts = _write(prefix, split(ROWS, 4))
    committed = commit(prefix, parts, 4)
    assert committed.rows == len(ROWS) and committed.removed == [] and committed.skipped == []
    ds = assert_same_as_write(prefix, ROWS, str(tmp_path))
    assert [os.path.basename(f) for f in ds.files] == committed.files
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert [e["partition"] for e in manifest["partitions"]] == [0, 1, 2, 3]
    assert manifest["rows"] == len(ROWS)
    assert sorted(os.listdir(prefix)) == sorted(committed.files + [MANIFEST])


def test_a_partition_writes_several_files_and_an_empty_one_none(tmp_path):
    prefix = str(tmp_path / "out")
    partitions = [ROWS[:70], [], ROWS[70:]]
    parts = _write(prefix, partitions, file_bytes=20_000)
    assert len(parts[0].files) > 1 and parts[1].files == () and parts[1].rows == 0
    commit(prefix, parts, 3)
    assert_same_as_write(prefix, ROWS, str(tmp_path))


def test_only_the_committed_attempt_is_read_and_the_others_are_removed(tmp_path):
    prefix = str(tmp_path / "out")
    parts = _write(prefix, split(ROWS, 3))
    again = write_part(split(ROWS, 3)[1], 1, prefix, FIELDS)  # a retry, or a speculative twin
    dead = write_part(ROWS[:5], 2, prefix, FIELDS)  # an attempt whose task was lost
    assert again.attempt != parts[1].attempt
    committed = commit(prefix, [parts[0], again, parts[1], parts[2]], 3)
    assert committed.files[1] == again.files[0]
    assert sorted(committed.removed) == sorted(parts[1].files + dead.files)
    assert_same_as_write(prefix, ROWS, str(tmp_path))


def test_parts_without_a_manifest_are_refused_and_cleaned(tmp_path):
    prefix = str(tmp_path / "out")
    parts = _write(prefix, split(ROWS, 2))
    with pytest.raises(LoadError, match="not committed.*python -m fastload clean"):
        fastload.open(prefix)
    assert main(["clean", prefix]) == 0
    assert os.listdir(prefix) == []
    with pytest.raises(FileNotFoundError):
        fastload.open(prefix)
    with pytest.raises(PartitionError, match="partition 0's file .* is not there"):
        commit(prefix, parts, 2)
    assert not os.path.exists(os.path.join(prefix, MANIFEST))


def test_clean_keeps_the_committed_files(tmp_path):
    prefix = str(tmp_path / "out")
    parts = _write(prefix, split(ROWS, 2))
    commit(prefix, parts, 2)
    late = write_part(ROWS[:3], 0, prefix, FIELDS)  # an attempt that ended after the commit
    assert clean(prefix) == list(late.files)
    assert_same_as_write(prefix, ROWS, str(tmp_path))


def test_a_directory_of_plain_files_opens_as_before(tmp_path):
    for name, rows in zip(("b.arrow", "a.arrow"), split(ROWS, 2)):
        fastload.write(tmp_path / name, rows, FIELDS, progress=False)
    ds = fastload.open(tmp_path)
    assert [os.path.basename(f) for f in ds.files] == ["a.arrow", "b.arrow"]
    assert ds[0]["name"] == "row-60"


def test_a_partition_without_a_part_commits_nothing(tmp_path):
    prefix = str(tmp_path / "out")
    parts = _write(prefix, split(ROWS, 3))
    with pytest.raises(PartitionError, match=r"partitions \[1\] have no part") as caught:
        commit(prefix, [parts[0], parts[2]], 3)
    assert caught.value.partition == 1
    assert not os.path.exists(os.path.join(prefix, MANIFEST))
    with pytest.raises(ValueError, match="no rows"):
        commit(prefix, [write_part([], 0, prefix, FIELDS)], 1)


def test_a_bad_row_fails_its_partition_or_is_skipped(tmp_path):
    prefix = str(tmp_path / "out")
    rows = [dict(r) for r in ROWS[:30]]
    rows[17]["image"] = b"not an image"
    with pytest.raises(PartitionError, match="fastload partition 2 failed.*LoadError") as caught:
        write_part(rows[15:20], 2, prefix, FIELDS)
    assert caught.value.partition == 2
    parts = _write(prefix, split(rows, 3), on_error="skip", file_bytes=2_000)
    committed = commit(prefix, parts, 3)
    [error] = committed.skipped
    assert isinstance(error, LoadError) and error.index == 7 and "partition 1" in str(error)
    assert_same_as_write(prefix, rows[:17] + rows[18:], str(tmp_path))


def test_engine_error_finds_the_partition_in_a_chain_or_a_message():
    try:
        write_part([{"image": b"x"}], 4, os.path.join(__file__, "under-a-file"), FIELDS)
    except PartitionError as exc:
        error = exc
    found = engine_error("P", RuntimeError("task failed").with_traceback(None))
    assert found.partition is None and "nothing was committed at P" in str(found)
    assert engine_error("P", error).partition == 4
    wrapped = RuntimeError(f"Job aborted: Traceback ...\n{error}\n  at java...")
    assert engine_error("P", wrapped).partition == 4
    assert "nothing was committed at P: fastload partition 4 failed" in str(
        engine_error("P", wrapped)
    )


def test_a_manifest_that_lists_a_missing_file_is_refused(tmp_path):
    prefix = str(tmp_path / "out")
    parts = _write(prefix, split(ROWS, 2))
    commit(prefix, parts, 2)
    os.unlink(os.path.join(prefix, parts[1].files[0]))
    with pytest.raises(LoadError, match="incomplete"):
        fastload.open(prefix)


def test_a_committed_prefix_is_replaced_only_when_asked(tmp_path):
    prefix = str(tmp_path / "out")
    old = _write(prefix, split(ROWS[:10], 1))
    commit(prefix, old, 1)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        prepare(prefix)
    prepare(prefix, overwrite=True)
    new = [write_part(rows, p, prefix, FIELDS) for p, rows in enumerate(split(ROWS, 2))]
    with pytest.raises(FileExistsError, match="nothing was committed.*overwrite=True"):
        commit(prefix, new, 2)
    assert_same_as_write(prefix, ROWS[:10], str(tmp_path))
    assert commit(prefix, new, 2, overwrite=True).removed == list(old[0].files)
    assert_same_as_write(prefix, ROWS, str(tmp_path))


def test_a_dataset_committed_after_prepare_is_not_replaced_silently(tmp_path):
    prefix = str(tmp_path / "out")
    prepare(prefix)
    first = _write(prefix, split(ROWS[:10], 1))
    second = [write_part(rows, p, prefix, FIELDS) for p, rows in enumerate(split(ROWS, 2))]
    commit(prefix, first, 1)
    with pytest.raises(FileExistsError, match="committed since the write began"):
        commit(prefix, second, 2)
    assert_same_as_write(prefix, ROWS[:10], str(tmp_path))


@pytest.mark.parametrize(
    "setting, error, match",
    [
        ({"on_error": "ignore"}, ValueError, "on_error must be 'raise' or 'skip'"),
        ({"file_bytes": 0}, ValueError, "file_bytes must be an int >= 1"),
        ({"block_bytes": 1.5}, ValueError, "block_bytes must be an int >= 1"),
        ({"source_field": "label"}, ValueError, "source_field must name a Str"),
        ({"metadata": {"when": object()}}, TypeError, "JSON serializable"),
    ],
)
def test_a_setting_that_write_refuses_is_refused_before_anything_is_written(
    tmp_path, setting, error, match
):
    prefix = str(tmp_path / "out")
    with pytest.raises(error, match=match):
        write_part(ROWS[:3], 0, prefix, FIELDS, **setting)
    assert not os.path.exists(prefix)


def test_the_settings_are_taken_by_name_checked_once_and_frozen(tmp_path):
    prefix = str(tmp_path / "out")
    given = {"prefix": prefix, "fields": FIELDS, "on_error": "skip", "retries": 2}
    settings = PartWrite.of(given)  # what is not a setting (retries) is not taken
    assert (settings.on_error, settings.overwrite, settings.block_bytes) == ("skip", False, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.on_error = "raise"
    with pytest.raises(TypeError, match="fields must be a non-empty dict"):
        PartWrite(prefix, {})
    with pytest.raises(ValueError, match="unknown field encoding 'int77'"):
        PartWrite(prefix, {**FIELDS, "label": "int77"})
    with pytest.raises(TypeError, match="overwrite must be True or False"):
        PartWrite(prefix, FIELDS, overwrite="yes")
    part = settings.write(ROWS[:5], 0)
    assert settings.commit([part], 1).rows == 5
    assert_same_as_write(prefix, ROWS[:5], str(tmp_path))


def test_importing_fastload_imports_no_engine():
    code = (
        "import sys, fastload, fastload.cluster, fastload.storage.parts\n"
        "engines = {'ray', 'dask', 'distributed', 'pyspark'} & set(sys.modules)\n"
        "assert not engines, engines\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


s3 = s3_fixture()  # with the bucket "parts"


def test_a_write_in_parts_at_s3_is_committed_whole(s3, tmp_path):
    prefix, options = "s3://parts/train", s3.storage_options
    parts = _write(prefix, split(ROWS, 3), storage_options=options)
    with pytest.raises(LoadError, match="not committed"):
        fastload.open(prefix, storage_options=options, cache_bytes=0)
    dup = write_part(split(ROWS, 3)[0], 0, prefix, FIELDS, storage_options=options)
    committed = commit(prefix, parts, 3, storage_options=options)
    assert committed.removed == list(dup.files)
    assert_same_as_write(prefix, ROWS, str(tmp_path), options, cache_bytes=0)
    assert_same_as_write(prefix + "/", ROWS, str(tmp_path), options, cache_bytes=0)
    assert s3.filesystem().cat_file(f"parts/train/{MANIFEST}").startswith(b"{")


def test_a_store_that_refuses_writes_fails_the_partition(s3):
    options = s3.storage_options
    with pytest.raises(PartitionError, match="partition 3 failed.*Error.*no-such-bucket") as caught:
        write_part(ROWS[:4], 3, "s3://no-such-bucket/x", FIELDS, storage_options=options)
    assert caught.value.partition == 3


def _blocks(prefix, rows, fields, block_bytes=None, storage_options=None):
    """The blocks of the dataset ``rows`` written in one part at ``prefix``."""
    part = write_part(
        rows, 0, prefix, fields, storage_options=storage_options, block_bytes=block_bytes
    )
    commit(prefix, [part], 1, storage_options=storage_options)
    if storage_options is None:
        return fastload.open(prefix).num_blocks
    return fastload.open(prefix, storage_options=storage_options, cache_bytes=0).num_blocks


def test_a_part_at_a_url_gets_the_url_block_size_and_a_local_one_the_file_size(s3, tmp_path):
    rows = [{"blob": bytes([i]) * (1 << 20)} for i in range(10)]  # 10 MiB of input
    fields, options = {"blob": Bytes()}, s3.storage_options
    assert _blocks("s3://parts/blocks", rows, fields, storage_options=options) == 3  # 4 MiB
    assert _blocks(str(tmp_path), rows, fields) == 1  # 64 MiB
    assert _blocks("s3://parts/given", rows, fields, 64 << 20, options) == 1
