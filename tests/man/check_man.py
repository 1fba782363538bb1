#!/usr/bin/env python3
"""check_man.py: the man pages say what the programs accept, no more, no less.

Usage: check_man.py MANDIR GPUSHARED GPUCTL GPUSHARE_EXECUTOR GPUSHARE_RUN

The programs are the source of truth and the pages are checked against
them, as sets of names (the prose of either may change freely):
  gpuctl.1             the global options of `gpuctl --help` under OPTIONS;
                       every command of `gpuctl --help` as a .SS under
                       COMMANDS, with the options of `gpuctl CMD --help`
                       as its .TP tags
  gpushared.8          the options of `gpushared --help` under OPTIONS
  gpushared.conf.5     the keys gpushared accepts (the list its refusal of
                       an unknown key gives) under KEYS
  gpushare-executor.8, gpushare-run.1
                       the options of their --help under OPTIONS
A name on a page that the program lacks fails as much as a missing one.
Prints "ok - ..." / "FAIL - ..." lines and a "N passed, N failed" line;
exit 0 when nothing failed.
"""
import os
import re
import subprocess
import sys
import tempfile

OPT = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")
passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok - {what}")
    else:
        failed += 1
        print(f"FAIL - {what}")


def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def plain(line):
    """A roff line as text: no macro name, fonts, quotes or escapes."""
    if line.startswith("."):
        line = line.split(None, 1)[1] if " " in line else ""
    line = re.sub(r"\\f(\[[^]]*\]|\(..|.)", "", line)
    line = line.replace("\\-", "-").replace("\\(lq", "").replace("\\(rq", "")
    return line.replace('"', "").strip()


def read_page(path):
    """{section: {subsection or "": [tag texts of its .TP entries]}}"""
    sections, sh, ss, tp = {}, None, "", False
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if line.startswith(".SH"):
                sh, ss = plain(line), ""
                sections.setdefault(sh, {"": []})
            elif line.startswith(".SS") and sh is not None:
                ss = plain(line)
                sections[sh].setdefault(ss, [])
            elif line.startswith(".TP"):
                tp = True
                continue
            elif tp and sh is not None:
                sections[sh][ss].append(plain(line))
            tp = False
    return sections


def opts_of(texts):
    return {m for t in texts for m in OPT.findall(t)}


def help_opts(text, start=None):
    """Options named at the head of the help's indented lines (after the
    line `start`, up to the next blank line, when given)."""
    lines = text.splitlines()
    if start is not None:
        i = next((k for k, l in enumerate(lines) if l.strip() == start), None)
        if i is None:
            return None
        lines = lines[i + 1:]
        end = next((k for k, l in enumerate(lines) if not l.strip()), len(lines))
        lines = lines[:end]
    found = set()
    for l in lines:
        if re.match(r"^\s+-", l):
            head = re.split(r"\s{2,}", l.strip())[0]
            found |= set(OPT.findall(head))
    return found


def compare(page_set, prog_set, what):
    missing = sorted(prog_set - page_set)
    extra = sorted(page_set - prog_set)
    check(not missing and not extra,
          f"{what}: {len(prog_set)} names" +
          (f"; missing from the page: {' '.join(missing)}" if missing else "") +
          (f"; on the page but not in the program: {' '.join(extra)}" if extra else ""))


def command_words(head):
    words = []
    for w in head.split():
        if not re.fullmatch(r"[a-z][a-z-]*", w):
            break
        words.append(w)
    return " ".join(words)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    mandir, gpushared, gpuctl, executor, gsrun = sys.argv[1:]

    # --- gpuctl.1
    page = read_page(os.path.join(mandir, "gpuctl.1"))
    rc, top = run(gpuctl, "--help")
    check(rc == 0, f"gpuctl --help exits 0 (exit {rc})")
    compare(opts_of(page.get("OPTIONS", {}).get("", [])),
            help_opts(top, "global options:") or set(), "gpuctl.1 OPTIONS vs gpuctl --help")
    lines = top.splitlines()
    at = next((k for k, l in enumerate(lines) if l.strip() == "commands:"), None)
    check(at is not None, "gpuctl --help lists its commands")
    commands = []
    for l in lines[(at or 0) + 1:]:
        if not l.strip():
            break
        commands.append(command_words(re.split(r"\s{2,}", l.strip())[0]))
    man_cmds = {command_words(ss): tags for ss, tags in page.get("COMMANDS", {}).items() if ss}
    compare(set(man_cmds), set(commands), "gpuctl.1 COMMANDS vs gpuctl --help")
    for c in commands:
        rc, text = run(gpuctl, *c.split(), "--help")
        want = help_opts(text, "options:") or set()
        check(rc == 0, f"gpuctl {c} --help exits 0 (exit {rc})")
        if c in man_cmds:
            compare(opts_of(man_cmds[c]), want, f"gpuctl.1 {c}")

    # --- the other programs' options
    for name, prog in (("gpushared.8", gpushared), ("gpushare-executor.8", executor),
                       ("gpushare-run.1", gsrun)):
        page = read_page(os.path.join(mandir, name))
        rc, text = run(prog, "--help")
        check(rc == 0, f"{os.path.basename(prog)} --help exits 0 (exit {rc})")
        compare(opts_of(page.get("OPTIONS", {}).get("", [])), help_opts(text),
                f"{name} OPTIONS vs {os.path.basename(prog)} --help")

    # --- gpushared.conf.5: the daemon names its keys when it refuses one
    page = read_page(os.path.join(mandir, "gpushared.conf.5"))
    man_keys = {t.split()[0] for t in page.get("KEYS", {}).get("", []) if t}
    with tempfile.TemporaryDirectory() as d:
        conf = os.path.join(d, "gpushared.conf")
        with open(conf, "w") as f:
            f.write("no_such_key_for_check_man = 1\n")
        rc, text = run(gpushared, "--config", conf, "--socket", os.path.join(d, "s"),
                       "--state-dir", os.path.join(d, "state"), "--foreground")
    m = re.search(r"allowed keys: ([a-z0-9_, ]+)", text)
    check(rc != 0 and m is not None,
          f"gpushared refuses an unknown key and lists the allowed ones (exit {rc}): {text.strip()[:200]}")
    if m:
        compare(man_keys, {k.strip() for k in m.group(1).split(",") if k.strip()},
                "gpushared.conf.5 KEYS vs the keys gpushared accepts")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
