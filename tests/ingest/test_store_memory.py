"""open_store bounds DuckDB's memory and gives it somewhere to spill, for on-disk and throw-away in-memory stores."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from servlens.errors import InputError
from servlens.store.schema import physical_memory_bytes, default_memory_limit_mib, open_store


def _settings(con) -> tuple[str, str]:
    return con.execute("SELECT current_setting('memory_limit'), current_setting('temp_directory')").fetchone()


def test_default_limit_is_what_the_work_needs_and_memory_stores_spill_to_the_system_temp_dir(monkeypatch):
    monkeypatch.delenv("SERVLENS_MEMORY_LIMIT", raising=False)
    monkeypatch.delenv("SERVLENS_TEMP_DIR", raising=False)
    con = open_store(None)
    limit, temp = _settings(con)
    expected_mib = min(512 + 128 * os.cpu_count(), int(physical_memory_bytes() * 0.6) // (1 << 20))
    number, unit = limit.split()
    assert float(number) * (1024 if unit == "GiB" else 1) == pytest.approx(expected_mib, rel=0.01)
    assert Path(temp).parent == Path(tempfile.gettempdir()) and Path(temp).name.startswith("servlens-spill-")
    assert not Path(temp).exists()  # created only when DuckDB spills


def test_the_default_limit_grows_with_threads_and_stays_under_sixty_percent_of_ram(monkeypatch):
    from servlens.store import schema

    monkeypatch.setattr(schema, "physical_memory_bytes", lambda: 24 << 30)
    assert [default_memory_limit_mib(n) for n in (1, 2, 8, 64)] == [640, 768, 1536, 8704]
    monkeypatch.setattr(schema, "physical_memory_bytes", lambda: 1 << 30)
    assert default_memory_limit_mib(2) == 614  # a small container: 60% of it
    monkeypatch.setattr(schema, "physical_memory_bytes", lambda: 256 << 20)
    assert default_memory_limit_mib(2) == 256


def test_on_disk_store_spills_next_to_itself(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("SERVLENS_TEMP_DIR", raising=False)
    monkeypatch.setenv("SERVLENS_MEMORY_LIMIT", "300MB")
    con = open_store(tmp_path / "store.duckdb")
    assert _settings(con) == ("286.1 MiB", str(tmp_path / "store.duckdb.tmp"))


def test_a_memory_store_past_its_limit_spills_to_servlens_temp_dir_and_cleans_up(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SERVLENS_MEMORY_LIMIT", "64MB")
    monkeypatch.setenv("SERVLENS_TEMP_DIR", str(tmp_path))
    con = open_store(None)
    limit, temp = _settings(con)
    assert limit == "61.0 MiB" and Path(temp).parent == tmp_path
    # ~200 MB of rows: more than the limit, so DuckDB must write them to the temp folder rather than fail
    con.execute("CREATE TABLE big AS SELECT range AS i, md5(range::VARCHAR) || md5((range + 1)::VARCHAR) AS s "
                "FROM range(2500000)")
    assert con.execute("SELECT count(*), count(DISTINCT s) FROM big").fetchone() == (2500000, 2500000)
    assert any(Path(temp).iterdir())
    con.close()
    assert not Path(temp).exists()


def test_a_memory_limit_duckdb_cannot_read_is_one_clear_sentence(monkeypatch):
    monkeypatch.setenv("SERVLENS_MEMORY_LIMIT", "lots")
    with pytest.raises(InputError) as caught:
        open_store(None)
    assert caught.value.message == "SERVLENS_MEMORY_LIMIT='lots' is not a memory size DuckDB takes"
