"""MkDocs hook: links that leave the site become repository paths.

The pages under docs/ are read in two places: on the repository, where a link such as
``results/leaderboard.md`` or ``../experiments/README.md`` opens that file, and on this site, which
holds only the pages in the nav (of docs/results/, whose pages the study scripts generate and which
link wherever they need to, only the findings, the speed study and the leaderboard). For the site, each link to a file that the site does not
hold is written as the file's path in the repository, in code, so that the reader knows where to
look, and a link to a file that the repository does not hold either is a warning, which
``mkdocs build --strict`` turns into an error. Images the site does hold (the figures under
docs/results/ are copied, see exclude_docs in mkdocs.yml) stay images.
"""
from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.repo_links")

# [text](target) or ![alt](target), with an optional "title"; code spans and fenced blocks are skipped.
_LINK = re.compile(r'(?P<bang>!?)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)(?:\s+"[^"\n]*")?\)')
_CODE = re.compile(r"(^```.*?^```[ \t]*$|`[^`\n]+`)", re.M | re.S)
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)", re.I)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    page_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target = match["target"]
        if _EXTERNAL.match(target):
            return match[0]
        path, _, anchor = target.partition("#")
        src_uri = posixpath.normpath(posixpath.join(page_dir, path))
        in_site = files.get_file_from_path(src_uri)
        if in_site is not None and not in_site.inclusion.is_excluded():
            return match[0]          # a page or a file of the site: mkdocs checks it
        where = (docs_dir / src_uri).resolve()
        try:
            shown = where.relative_to(repo).as_posix()
        except ValueError:
            shown = None
        if shown is None or not where.exists():
            log.warning(f"Doc file '{page.file.src_uri}' links to '{target}', which is neither a page "
                        f"of the site nor a file of the repository")
            return match[0]
        shown += f"#{anchor}" if anchor else ""
        text = match["text"].strip("`")
        if match["bang"]:
            return f"(figure: `{shown}`{', ' + text if text else ''})"
        if text in (shown, path, src_uri, posixpath.basename(path)) or not text:
            return f"`{shown}`"
        return f"{match['text']} (`{shown}`)"

    # Rewrite outside code only: a code span or block shows its text as written.
    pieces = _CODE.split(markdown)
    return "".join(piece if i % 2 else _LINK.sub(rewrite, piece) for i, piece in enumerate(pieces))
