"""The description at the top of an MLflow run's page: the run's ``mlflow.note.content`` tag,
which MLflow's UI renders as Markdown.

A pipeline run writes it in sections, one per thing an operator looks for: how the run ended,
what the run is, the table it built, the gate's verdict. Each step writes its own section as it
learns it; a section written again replaces the old one, so a retried task, or a callback that
corrects an ending, leaves one of each. The tags say the same things, but the run page shows a
tag cut to one line (an ending such as "DAG run failed at task measure_acceptance: ..." reads
"tabletu... : DAG run failed at task measur..."), while the description shows the whole text.

Sections keep one order, the ending first. Text a person wrote in the UI's description editor
above the first section stays at the top.
"""

from __future__ import annotations

__all__ = ["NOTE_TAG", "SECTIONS", "plain", "sections_of", "with_section"]

NOTE_TAG = "mlflow.note.content"
SECTIONS = ("Outcome", "Run", "Candidate table", "Gate")
_HEADING = "#### "


def sections_of(note: str) -> tuple[str, dict[str, str]]:
    """(the text above the first section, {heading: body}) of a note."""
    preamble: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] = preamble
    for line in note.splitlines():
        if line.startswith(_HEADING):
            current = sections.setdefault(line[len(_HEADING):].strip(), [])
            current.clear()  # a heading written twice by hand: the later body wins
        else:
            current.append(line)
    return "\n".join(preamble).strip(), {h: "\n".join(b).strip() for h, b in sections.items()}


def with_section(note: str, heading: str, body: str) -> str:
    """``note`` with section ``heading`` set to ``body`` (added, or replacing the old body)."""
    if heading.strip() != heading or not heading or "\n" in heading:
        raise ValueError(f"section heading {heading!r}: one line, no surrounding spaces")
    preamble, sections = sections_of(note)
    sections[heading] = body.strip()
    order = [h for h in SECTIONS if h in sections] + [h for h in sections if h not in SECTIONS]
    parts = ([preamble] if preamble else []) + [f"{_HEADING}{h}\n{sections[h]}" for h in order]
    return "\n\n".join(parts) + "\n"


_MARKDOWN_SPECIALS = "\\`*_[]<#|"


def plain(text: str) -> str:
    """``text`` as literal Markdown: an ending or a gate's reason may hold ``*``, ``_`` or
    ``|`` (paths, table edges) that the UI would otherwise read as markup."""
    return "".join("\\" + c if c in _MARKDOWN_SPECIALS else c for c in str(text))
