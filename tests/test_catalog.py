"""The Catalog object: data held by an explicit object, two catalogs side by side, no stale cache."""

import shutil
from pathlib import Path

import pytest

import simulator
from simulator.catalog import Catalog, CatalogDirs, default_catalog
from simulator.datadirs import data_root
from tests.conftest import small_scenario


def _copy_data(tmp_path: Path) -> Path:
    """A copy of the shipped topologies/ and model presets under tmp_path."""
    shutil.copytree(data_root() / "topologies", tmp_path / "topologies")
    shutil.copytree(data_root() / "scenarios" / "models", tmp_path / "scenarios" / "models")
    return tmp_path


def _edit_a100_memory(root: Path, new: str) -> None:
    gpus = root / "topologies" / "gpus.yaml"
    text = gpus.read_text()
    start = text.index("a100-80gb:")
    head, tail = text[:start], text[start:]
    line = next(line for line in tail.splitlines() if line.strip().startswith("memory:"))
    gpus.write_text(head + tail.replace(line, line.split(":")[0] + ": " + new, 1))


def test_two_catalogs_coexist(tmp_path):
    """A catalog of an edited copy sees the edit (40 GiB = 42 949 672 960 B); the default does not."""
    root = _copy_data(tmp_path)
    _edit_a100_memory(root, "40GiB")
    edited = Catalog.load(root)
    assert edited.gpus["a100-80gb"].memory_bytes == 40 * 2**30
    assert default_catalog().gpus["a100-80gb"].memory_bytes == 80 * 2**30
    assert edited.gpus["a100-80gb"].memory_bytes == 40 * 2**30
    assert default_catalog().gpus["a100-80gb"].memory_bytes == 80 * 2**30

    data = small_scenario(cluster={"node": "p4de.24xlarge", "nodes": 2})
    mine = simulator.Scenario.model_validate(data, context={"catalog": edited})
    shipped = simulator.Scenario.model_validate(data)
    assert mine.cluster.gpu_spec.memory_bytes == 40 * 2**30
    assert shipped.cluster.gpu_spec.memory_bytes == 80 * 2**30


def test_load_scenario_with_a_catalog(tmp_path, root):
    data = _copy_data(tmp_path / "data")
    _edit_a100_memory(data, "20GiB")
    catalog = Catalog.load(CatalogDirs.under(data))
    path = root / "scenarios/quickstart.yaml"
    mine = simulator.load_scenario(path, ["cluster.node=p4de.24xlarge"], catalog=catalog)
    shipped = simulator.load_scenario(path, ["cluster.node=p4de.24xlarge"])
    assert mine.cluster.gpu_spec.memory_bytes == 20 * 2**30
    assert shipped.cluster.gpu_spec.memory_bytes == 80 * 2**30
    assert mine.content_hash() == shipped.content_hash()  # the file names the same things


def test_default_catalog_rereads_changed_files(tmp_path, monkeypatch):
    """The default catalog follows DTSIM_DATA_DIR and an edit of gpus.yaml, with no cache to clear."""
    root = _copy_data(tmp_path)
    (root / "scenarios" / "sweeps").mkdir()
    monkeypatch.setenv("DTSIM_DATA_DIR", str(root))
    data_root.cache_clear()
    try:
        before = default_catalog()
        assert before.gpus["a100-80gb"].memory_bytes == 80 * 2**30
        assert default_catalog() is before  # nothing changed: the same object, nothing read again
        _edit_a100_memory(root, "48GiB")
        after = default_catalog()
        assert after is not before and after.gpus["a100-80gb"].memory_bytes == 48 * 2**30
        assert before.gpus["a100-80gb"].memory_bytes == 80 * 2**30  # an existing catalog never changes
    finally:
        monkeypatch.delenv("DTSIM_DATA_DIR")
        data_root.cache_clear()
    assert default_catalog().gpus["a100-80gb"].memory_bytes == 80 * 2**30


def test_catalog_lookups_name_what_is_missing():
    catalog = default_catalog()
    with pytest.raises(simulator.ScenarioError, match="unknown GPU 'b200'"):
        catalog.gpu("b200")
    with pytest.raises(simulator.ScenarioError, match="unknown transport 'carrier-pigeon'"):
        catalog.transport("carrier-pigeon")
    with pytest.raises(simulator.ScenarioError, match="unknown model preset 'gpt9'"):
        catalog.preset("gpt9")
    assert catalog.nccl.overlap_compute_slowdown == default_catalog().nccl.overlap_compute_slowdown


def test_profile_is_read_again_when_the_file_changes(tmp_path):
    catalog = default_catalog()
    path = tmp_path / "p.yaml"
    path.write_text(catalog.builtin_profile_path("a100-80gb").read_text())
    first = catalog.profile(path)
    assert catalog.profile(path) is first
    path.write_text(path.read_text().replace("calibrated: false", "calibrated: true") + "\n# edited\n")
    assert catalog.profile(path) is not first
