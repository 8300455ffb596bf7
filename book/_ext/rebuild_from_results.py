"""The book's pages are computed from the runs that `book/results` links to; this extension keeps that
link and what hangs on it right at every build.

- A fresh clone has no link yet: it is pointed at the reference results shipped in the repository
  (`reference/report`), so that `jupyter-book build book` works before anything was trained.
- The runs are written out as one tidy table, `_generated/all_runs.csv` (one row per run and epoch,
  the run's settings as columns), which the results chapter offers for download.
- The executed run notebooks all open with the notebook's own title; each page is titled by its run
  instead (world size, dataset, model), so the contents and the PDF can tell them apart.
- Sphinx reads a page again only when its source changed, but a new run, or the link pointed at
  other runs, changes the pages with no source change. So every build reads every page again (a
  few seconds: the pages only analyse CSVs).
"""

import json
from pathlib import Path

from sphinx.errors import ExtensionError

REFERENCE = Path("..") / "reference" / "report"  # relative to book/, where the link lives


def link_and_tabulate(app):
    from ddp_core.report.results import ResultsError, load_experiment, tidy_runs

    source = Path(app.srcdir)
    link = source / "results"
    if not link.exists() and not link.is_symlink():
        link.symlink_to(REFERENCE)
    try:
        table = tidy_runs(load_experiment(link))
    except ResultsError as exc:
        raise ExtensionError(f"book/results: {exc}") from None
    (source / "_generated").mkdir(exist_ok=True)
    table.to_csv(source / "_generated" / "all_runs.csv", index=False)


RUN_TITLE = "# One training run"


def title_run_page(app, docname, source):
    parts = docname.split("/")
    if len(parts) != 3 or parts[0] != "results" or parts[2] != "run_experiment":
        return
    info = json.loads((Path(app.srcdir) / "results" / parts[1] / "run.json").read_text())
    n = info["world_size"]
    repeat = f", repeat {parts[1].split('-r')[1]}" if "-r" in parts[1] else ""
    title = (f"# Run on {n} rank{'s' if n > 1 else ''}{repeat}: {info['config']['dataset']}, "
             f"{info['config']['preset']} model, seed {info['config']['seed']}")
    source[0] = source[0].replace(json.dumps(RUN_TITLE)[1:-1], json.dumps(title)[1:-1], 1)


def every_page(app, env, added, changed, removed):
    return sorted(env.found_docs - added - changed - removed)


def setup(app):
    app.connect("builder-inited", link_and_tabulate)
    app.connect("source-read", title_run_page)
    app.connect("env-get-outdated", every_page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
