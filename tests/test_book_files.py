"""pt215.book_files: the book's scripts and data found through pt215, in a checkout or an installed wheel."""

from __future__ import annotations

import pytest

from pt215.book_files import BookFilesError, chapter_script, data_path


def test_shipped_files_are_found_through_pt215():
    assert chapter_script("hello.py").parent.name == "00-before-you-start"
    assert chapter_script("00-before-you-start/hello.py").is_file()
    assert data_path("05-nvfp4-decoding/lm-dense.pt").is_file()
    with pytest.raises(BookFilesError, match="no chapter of the book has a script named 'nope.py'"):
        chapter_script("nope.py")
    with pytest.raises(ValueError, match="relative must be a path inside data/"):
        data_path("../secrets")
