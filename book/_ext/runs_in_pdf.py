"""The PDF leaves out the page of each run, a glob of book/_toc.yml, about two printed pages each.

The runs chapter's table stands for them, and the site keeps them."""

from sphinx import addnodes
from sphinx.util.matching import patmatch


def drop_globbed_pages(app, doctree, docname) -> None:
    site_map = getattr(app.env, "external_site_map", None)
    if app.builder.format != "latex" or site_map is None:
        return
    globs = list(site_map.globs())
    # The LaTeX builder inlines every page into one document before it resolves references.
    # Each page arrives wrapped in a `start_of_file` node named after it.
    for page in list(doctree.findall(addnodes.start_of_file)):
        if any(patmatch(page["docname"], pattern) for pattern in globs):
            page.parent.remove(page)


def setup(app):
    app.connect("doctree-resolved", drop_globbed_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
