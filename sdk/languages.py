"""File extension -> language name: the fence tag of an edit, the label of a document."""

from __future__ import annotations

import os
import posixpath

LANGUAGES = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript",
    ".cjs": "javascript", ".jsx": "jsx", ".ts": "typescript", ".tsx": "tsx", ".go": "go",
    ".rs": "rust", ".java": "java", ".kt": "kotlin", ".scala": "scala", ".c": "c",
    ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".cs": "csharp",
    ".rb": "ruby", ".php": "php", ".swift": "swift", ".sh": "bash", ".bash": "bash",
    ".sql": "sql", ".html": "html", ".css": "css", ".json": "json", ".yaml": "yaml",
    ".yml": "yaml", ".toml": "toml", ".xml": "xml", ".md": "markdown", ".rst": "rst",
    ".txt": "text",
}  # fmt: skip
"""Names as Markdown fence tags use them (GitHub Linguist's aliases)."""


def language_for(path: str | os.PathLike[str] | None) -> str | None:
    """The language of a file name from its extension (case-insensitive), or None."""
    if path is None:
        return None
    return LANGUAGES.get(posixpath.splitext(os.fspath(path))[1].lower())
