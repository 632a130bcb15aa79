"""The workshop pages' generated tables (`pt215.site.workshop`): the per-user memory figure, and the data
files they render carry what the tables read."""

from __future__ import annotations

import json

import pytest

from pt215.site import agenda, workshop
from pt215.site.workshop import per_user_memory_gib


def test_per_user_memory_is_the_largest_pss_peak_plus_one_idle_kernel():
    rows = [{"notebook": "a.ipynb", "peak_pss_mib": 3000}, {"notebook": "b.ipynb", "peak_pss_mib": 700},
            {"notebook": "c.ipynb", "peak_pss_mib": 1200}]
    limit, top, low = per_user_memory_gib(rows)
    assert (top["notebook"], low["notebook"]) == ("a.ipynb", "b.ipynb")
    assert limit == 4.0  # (3000 + 700) MiB = 3.6 GiB, rounded up to half a GiB


def test_a_notebook_without_torch_does_not_stand_for_the_idle_kernel():
    rows = [{"notebook": "a.ipynb", "peak_pss_mib": 2359, "peak_rss_mib": 3843},
            {"notebook": "b.ipynb", "peak_pss_mib": 381, "peak_rss_mib": 815},
            {"notebook": "c.ipynb", "peak_pss_mib": 75, "peak_rss_mib": 101}]  # its kernel never imported torch
    limit, top, low = per_user_memory_gib(rows)
    assert (top["notebook"], low["notebook"], limit) == ("a.ipynb", "b.ipynb", 3.0)  # 2740 MiB -> 3.0 GiB


def test_the_hub_limit_passes_the_doctor():
    from pt215 import doctor

    assert workshop.DOCTOR_MEM_FAIL_GIB == doctor.MEM_FAIL_GIB
    assert workshop.hub_memory_limit_gib(3.0) == doctor.MEM_FAIL_GIB  # the stored peaks ask for 3.0 GiB
    assert workshop.hub_memory_limit_gib(5.5) == 5.5
    assert doctor.check_memory(workshop.hub_memory_limit_gib(3.0), 3.5, "cgroup limit").verdict != "fail"


def test_hub_sizing_data_has_what_the_tables_read(book_root):
    data = json.loads((book_root / workshop.HUB_SIZING).read_text())
    assert {"date", "torch", "python", "cpu", "cores", "memory_gib", "interval_s", "command"} <= set(data["provenance"])
    for r in data["notebooks"]:
        assert {"notebook", "chapter", "wall_s", "peak_processes", "peak_rss_mib", "peak_cores"} <= set(r)


def test_concurrent_runs_record_their_conditions(book_root):
    path = book_root / agenda.CONCURRENT_RUNS
    if not path.is_file():
        pytest.skip("no concurrent measurement in this checkout")
    data = json.loads(path.read_text())
    assert {"participants", "cores", "command", "date"} <= set(data["provenance"])
    for r in data["notebooks"]:
        assert r["completed"] <= data["provenance"]["participants"]
        assert {"load_average_1_5_15", "memory_available_gib"} <= set(r["conditions_before"])


def test_install_size_is_measured_or_says_it_is_not(book_root):
    data = json.loads((book_root / workshop.INSTALL_SIZE).read_text())
    assert data["download"]["total_bytes"] > data["download"]["rest_bytes"] > 0
    cpu_measured = data["download"]["cpu_torch_wheel_bytes"] is not None
    assert (data["download"]["cpu_choice_bytes"] is not None) == cpu_measured
    assert ("did not answer" in data["cpu_choice_how"]) == (not cpu_measured)


def test_handouts_cover_each_chapter_and_name_unknown_ones(tmp_path, book_root):
    import importlib.util

    spec = importlib.util.spec_from_file_location("print_handouts", book_root / "scripts" / "print_handouts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for rel in ("chapters/00-a/index.html", "chapters/02-b/index.html", "chapters/workshop/notes.html"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("<html></html>")
    assert [n for n, _ in mod.pages(tmp_path, [])] == ["00-a", "02-b", "workshop-notes"]
    assert [n for n, _ in mod.pages(tmp_path, ["02-b"])] == ["02-b"]
    with pytest.raises(SystemExit, match="no built page for 09-x"):
        mod.pages(tmp_path, ["09-x"])
