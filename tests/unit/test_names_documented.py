"""The vocabulary and its documentation agree: every name in ``common.names`` is on the KAI compatibility page."""

from __future__ import annotations

from common import names
from tests.conftest import REPO

PAGE = REPO / "docs" / "kai-compatibility.md"


def _vocabulary() -> dict[str, str]:
    found = {key: value for key, value in vars(names).items() if key.isupper() and isinstance(value, str)}
    found.update({f"KAI_PRIORITY_CLASSES[{name}]": name for name in names.KAI_PRIORITY_CLASSES})
    return found


def test_every_name_of_the_vocabulary_is_documented_on_the_compatibility_page() -> None:
    page = PAGE.read_text()
    missing = {key: value for key, value in _vocabulary().items() if value not in page}
    assert missing == {}, f"document these in {PAGE.relative_to(REPO)} (or drop them from common/names.py)"


def test_no_name_is_defined_twice_in_the_vocabulary() -> None:
    values = [value for key, value in _vocabulary().items() if not key.startswith("KAI_PRIORITY_CLASSES")]
    assert sorted(value for value in set(values) if values.count(value) > 1) == []
