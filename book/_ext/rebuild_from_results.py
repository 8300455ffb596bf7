"""Keeps the links under `book/results`, from which the book's pages are computed, right at every build.

- `book/results/<study>` links to the user's runs of a study where there are any, else to the reference runs.
- Benchmark runs (`BENCHMARK_RUNS`) link the same way, and so does each device's measurement (`MEASUREMENTS`).
- `_generated/all_runs.csv` holds every run as one tidy table, which the results chapter offers.
- Only the strong-scaling study's runs get a page each, titled by its run.
- Every build reads every page again, since a new run changes pages without changing their sources.
"""

import json
import os
from pathlib import Path

from sphinx.errors import ExtensionError


# The measurements of the benchmarks single_device.py, peers and step_profile, a folder per device.
MEASUREMENTS = ("single_device", "peers", "step_profile")
# Runs of a benchmark that a page reads as it reads a study's: linked the same way, the user's when there are any.
# cpu_period: benchmarks/cpu_period.py. gpu_trainer and gpu_timeline: the trainer on a GPU, by gpu_session.sh.
BENCHMARK_RUNS = ("cpu_period", "gpu_trainer", "gpu_timeline")


def link_and_tabulate(app):
    from ddp_core.paths import RESULTS_DIR
    from ddp_core.analysis.results import ResultsError, study_tables
    from ddp_core.studies.study_list import StudyError, load_study_list

    project = Path(app.srcdir).parent
    results = Path(os.environ.get("DDP_CORE_RESULTS_DIR") or project / RESULTS_DIR)
    folder = Path(app.srcdir) / "results"
    if folder.is_symlink():  # the layout before studies: one link to one experiment
        folder.unlink()
    folder.mkdir(exist_ok=True)
    try:
        studies = load_study_list()
    except StudyError as exc:
        raise ExtensionError(f"study list: {exc}") from None
    for name in [*studies, *BENCHMARK_RUNS]:  # the studies of notebooks/studies.yml, then the benchmark runs
        mine = results / name  # $DDP_CORE_RESULTS_DIR/<study>, default results/<study>
        # The reference runs let a fresh clone build the book before anything was trained.
        # `make report STUDIES=...` replaces only the studies it ran.
        target = mine if any(mine.glob("**/run.json")) else project / "reference" / name
        link = folder / name
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target.resolve())
    for measurement in MEASUREMENTS:  # the reference ones, each replaced by the user's own of the same device
        link_measurements(folder / measurement, [project / "reference" / measurement, results / measurement])
    try:
        table = study_tables(folder, list(studies))
    except ResultsError as exc:
        raise ExtensionError(f"book/results: {exc}") from None
    # one row per run and epoch, with the study, the run's settings and where it ran as columns
    (Path(app.srcdir) / "_generated").mkdir(exist_ok=True)
    table.to_csv(Path(app.srcdir) / "_generated" / "all_runs.csv", index=False)


def link_measurements(folder: Path, sources: list[Path]) -> None:
    """A link per measured device in `folder`; a later source's measurement of a device replaces an earlier one's."""
    folder.mkdir(exist_ok=True)
    for link in folder.iterdir():
        link.unlink()
    for source in sources:
        for measured in sorted(source.glob("*/device.json")):
            link = folder / measured.parent.name
            if link.is_symlink():
                link.unlink()
            link.symlink_to(measured.parent.resolve())


# The other studies' runs are many, and their executed notebooks stay in their folders, out of the sources.
RUN_PAGES_OF = "scaling"


def exclude_other_run_pages(app, config):
    from ddp_core.studies.study_list import load_study_list

    config.exclude_patterns += [f"results/{name}/**" for name in load_study_list() if name != RUN_PAGES_OF]


# Every executed run notebook opens with this title. Each page is titled by its run instead, so the contents and the
# PDF can tell them apart.
RUN_TITLE = "# One training run"


def title_run_page(app, docname, source):
    from ddp_core.analysis.tables import counted, in_words

    parts = docname.split("/")
    if parts[0] != "results" or parts[-1] != "run_experiment":
        return
    run = parts[-2]
    info = json.loads((Path(app.srcdir).joinpath(*parts[:-1]) / "run.json").read_text())
    n = info["world_size"]
    repeat = f", repeat {run.split('-r')[1] if '-r' in run else 1}"  # every title names it, the first one too
    title = (
        f"# Run on {counted(n, 'rank')}{repeat}: {in_words(info['config']['dataset'])}, "
        f"{info['config']['preset']} model, seed {info['config']['seed']}"
    )
    source[0] = source[0].replace(json.dumps(RUN_TITLE)[1:-1], json.dumps(title)[1:-1], 1)
    # Runs made before the command was printed in continued lines (launch.plan.shell_command) printed it on one line.
    # Their pages show it the new way, so that it fits the PDF's page.
    source[0] = wrap_printed_commands(source[0])


def wrap_printed_commands(notebook_json: str) -> str:
    """The notebook with each one-line `$ COMMAND` of its printed output in the lines that the runs print now."""
    import shlex

    from ddp_core.launch.plan import shell_command

    def wrapped(line):
        if not line.startswith("$ ") or line.endswith("\\"):
            return line
        try:
            return shell_command(shlex.split(line[2:]))
        except ValueError:  # unbalanced quotes: not a command that this can read
            return line

    notebook, changed = json.loads(notebook_json), False
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            if output.get("output_type") != "stream":
                continue
            text = "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
            new = "\n".join(wrapped(line) for line in text.split("\n"))
            if new != text:
                output["text"], changed = new, True
    return json.dumps(notebook, indent=1, ensure_ascii=False) if changed else notebook_json


# Sphinx reads a page again only when its source changed, but a new run or relinked results change pages too.
# So every build reads every page again: a few seconds, as the pages only analyse CSVs.
def every_page(app, env, added, changed, removed):
    return sorted(env.found_docs - added - changed - removed)


def setup(app):
    app.connect("config-inited", exclude_other_run_pages)
    app.connect("builder-inited", link_and_tabulate)
    app.connect("source-read", title_run_page)
    app.connect("env-get-outdated", every_page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
