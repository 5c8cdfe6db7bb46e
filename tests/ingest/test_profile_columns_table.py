"""docs/profiles.md's formats x canonical-columns table: computed from the real samples, kept current."""

from __future__ import annotations

import pytest

from servlens.ingest.profiles import builtin_profiles
from tests.ingest import profile_columns
from tests.ingest.format_rows import sniffed_name


def test_every_builtin_profile_has_a_sample_that_sniffs_as_it():
    assert sorted(profile_columns.SAMPLES) == sorted(p.name for p in builtin_profiles())
    for name, paths in profile_columns.SAMPLES.items():
        for path in paths:
            assert sniffed_name(profile_columns.REPO / path) == name, path


@pytest.mark.slow  # ingests every built-in profile's samples: ~15 s CPU, a minute on a loaded machine
def test_docs_table_is_current():
    assert profile_columns.main(["--check"]) == 0, "run: python -m tests.ingest.profile_columns --write"
