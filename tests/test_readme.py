"""The README is a front page: two commands on its first screen, the same ones CI and a newcomer run."""

import re

from conftest import REPO

README = (REPO / "README.md").read_text()


def test_the_first_screen_gives_exactly_two_commands_report_and_test():
    first_block = re.search(r"```bash\n(.*?)```", README, re.DOTALL)
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands == ["make report", "make test"]
    assert README[: first_block.end()].count("\n") < 25, "the commands are not on the first screen"
    assert "```" not in README[first_block.end() :], "a second block of commands on the front page"


def test_ci_runs_the_readmes_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_every_file_the_readme_links_is_in_the_repository():
    links = [target for target in re.findall(r"\]\(([^)\s]+)\)", README) if "://" not in target]
    assert links, "the README links no file (its headline figure?)"
    missing = [target for target in links if not (REPO / target).exists()]
    assert not missing, f"README links files that are not there: {missing}"


def test_the_readme_fits_two_screens():
    assert README.count("\n") <= 60
