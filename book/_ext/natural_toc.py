"""The pages that a glob of book/_toc.yml lists come in natural order: n1, n1-r2, n1-r3, n2, n2-r2, ..., n10.

sphinx-external-toc sorts them as plain strings, which puts `n1-r2` before `n1` and `n10` before `n2`.
The order holds wherever the toctree shows: the sidebar, a page's `{tableofcontents}` and the PDF's chapters.
"""

import re

from sphinx import addnodes
from sphinx.transforms import SphinxTransform
from sphinx.util.matching import patmatch

DIGITS = re.compile(r"(\d+)")


def natural_key(docname: str) -> list[list]:
    """Each folder of the path split into its text and its numbers, which compare by value."""
    # One folder at a time: as whole strings, `-` sorts before `/`, so `n1-r2` came before `n1`.
    return [[int(part) if k % 2 else part for k, part in enumerate(DIGITS.split(name))] for name in docname.split("/")]


def sort_globbed(docnames: list, globs: list[str], key=lambda item: item) -> list:
    """`docnames` with each run of consecutive items matched by the same glob put in natural order."""

    def glob_of(item):
        return next((pattern for pattern in globs if patmatch(key(item), pattern)), None)

    result, run, run_glob = [], [], None
    for item in [*docnames, None]:
        pattern = glob_of(item) if item is not None else None
        if run and (pattern is None or pattern != run_glob):
            result += sorted(run, key=lambda entry: natural_key(key(entry)))
            run = []
        if pattern is not None:
            run, run_glob = [*run, item], pattern
        elif item is not None:
            result.append(item)
    return result


class NaturalGlobOrder(SphinxTransform):
    """Reorder the toctrees that sphinx-external-toc inserted, before Sphinx collects them at doctree-read."""

    default_priority = 150  # after sphinx-external-toc's transform, priority 100

    def apply(self, **kwargs) -> None:
        site_map = getattr(self.env, "external_site_map", None)
        globs = sorted(site_map.globs()) if site_map is not None else []
        if not globs:
            return
        for toctree in self.document.findall(addnodes.toctree):
            if not toctree.get("glob"):
                continue
            toctree["entries"] = sort_globbed(toctree["entries"], globs, key=lambda entry: entry[1])
            toctree["includefiles"] = sort_globbed(toctree["includefiles"], globs)


def setup(app):
    app.add_transform(NaturalGlobOrder)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
