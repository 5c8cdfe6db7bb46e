"""commands._common.import_in_background: modules load in a thread the caller joins; a missing one is left for the
caller's own import to report."""

from __future__ import annotations

import sys

from servlens.commands._common import import_in_background


def test_modules_are_imported_by_the_time_the_thread_is_joined(tmp_path, monkeypatch):
    (tmp_path / "sl_probe_first.py").write_text("LOADED = True\n")
    (tmp_path / "sl_probe_second.py").write_text("import sl_probe_first\nLOADED = sl_probe_first.LOADED\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("sl_probe_first", "sl_probe_second"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    thread = import_in_background("sl_probe_first", "sl_probe_second")
    thread.join(timeout=30)
    assert not thread.is_alive() and thread.daemon
    assert sys.modules["sl_probe_second"].LOADED is True


def test_a_missing_module_ends_the_thread_quietly(tmp_path, monkeypatch):
    (tmp_path / "sl_probe_after_missing.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sl_probe_after_missing", raising=False)
    thread = import_in_background("sl_no_such_module_anywhere", "sl_probe_after_missing")
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert "sl_no_such_module_anywhere" not in sys.modules
    assert "sl_probe_after_missing" not in sys.modules  # it stops at the first failure; the caller's import reports
