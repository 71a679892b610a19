"""training/workroot.py: the paths Airflow params name stay inside the work root."""

import pytest

from training.workroot import OutsideWorkRoot, confine, work_root


def test_paths_inside_the_root_resolve(tmp_path):
    root = tmp_path / "root"
    (root / "work").mkdir(parents=True)
    assert confine(str(root / "work"), "workdir", root) == str((root / "work").resolve())
    assert confine("work/data", "workdir", root) == str((root / "work" / "data").resolve())  # relative: to the root
    assert confine(str(root), "workdir", root) == str(root.resolve())


@pytest.mark.parametrize("value", ["/", "/etc", "../outside", "work/../../outside", "~", "", "   ", "a\x00b",
                                   "x" * 2000])
def test_paths_outside_the_root_or_unusable_are_refused(tmp_path, value):
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(OutsideWorkRoot, match="param workdir"):
        confine(value, "workdir", root)


def test_a_symlink_out_of_the_root_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(OutsideWorkRoot, match="outside the work root"):
        confine(str(root / "link" / "data"), "workdir", root)


def test_the_root_comes_from_the_operator(monkeypatch, tmp_path):
    monkeypatch.setenv("SEQENC_WORK_ROOT", str(tmp_path / "a"))
    monkeypatch.setenv("SEQENC_WORKDIR", str(tmp_path / "b"))
    assert work_root() == (tmp_path / "a").resolve()
    monkeypatch.delenv("SEQENC_WORK_ROOT")
    assert work_root() == (tmp_path / "b").resolve()
    with pytest.raises(OutsideWorkRoot):
        confine(str(tmp_path / "a"), "workdir")


def test_every_dag_takes_its_path_params_through_confine():
    """Each DAG reads its workdir (and catalog / landing / config_path) through confine."""
    from pathlib import Path

    dags = Path(__file__).resolve().parents[1] / "dags"
    for dag in sorted(dags.glob("seqenc_*.py")):
        text = dag.read_text()
        assert 'confine(params["workdir"], "workdir")' in text or \
            'confine(get_current_context()["params"]["workdir"], "workdir")' in text, dag.name
        assert 'os.path.expanduser(params["workdir"])' not in text, dag.name
        if '"catalog": Param(' in text:
            assert 'confine(given, "catalog")' in text, dag.name
