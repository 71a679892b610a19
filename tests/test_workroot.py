"""training/airflow/workroot.py: the paths Airflow params name stay inside the work root."""

import pytest

from training.airflow.workroot import OutsideWorkRoot, confine, work_root


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
    """Each DAG reads its path params (workdir, catalog, landing, config_path) through
    training.airflow.context, which confines every one; no DAG file or DAG callable reads them itself."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    context = (repo / "training" / "airflow" / "context.py").read_text()
    assert 'confine(params()["workdir"], "workdir")' in context
    for param in ("catalog", "landing", "config_path"):
        assert f'confine(given, "{param}")' in context or f'confine(path, "{param}")' in context, param
    readers = [*sorted((repo / "dags").glob("seqenc_*.py")),
               *(p for p in sorted((repo / "training" / "airflow").glob("*.py")) if p.name not in ("context.py",
                                                                                           "workroot.py"))]
    for path in readers:
        text = path.read_text()
        for param in ("workdir", "catalog", "landing", "config_path"):
            assert f'params["{param}"]' not in text and f'get("{param}")' not in text, (path.name, param)
        assert "expanduser" not in text, path.name
