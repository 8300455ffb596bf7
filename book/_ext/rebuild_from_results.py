"""Sphinx reads a page again only when its source changed, but these pages are computed from the CSVs
in book/results: a new run, or the link pointed at other runs, changes them with no source change.
So every build reads every page again (a few seconds: the pages only analyse CSVs)."""


def every_page(app, env, added, changed, removed):
    return sorted(env.found_docs - added - changed - removed)


def setup(app):
    app.connect("env-get-outdated", every_page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
