#!/usr/bin/env bash
# Install the pinned coding-agent CLIs (Claude Code, Codex, Gemini CLI, Pi) project-locally into tools/agents.
#
#   scripts/install-agent-clis.sh            # install if needed, then print the four versions
#   AGENT_CLIS_PREFIX=/some/dir scripts/...  # install somewhere else (default: <repo>/tools/agents)
#
# The pins live in one committed place: scripts/agents/package.json (exact versions). The script
# copies it to $PREFIX/package.json and runs `npm install --prefix $PREFIX --no-audit --no-fund`;
# never a global install. It is idempotent and fast when the pinned versions are already there
# (no npm call at all). Afterwards it checks that `claude`, `codex`, `gemini` and `pi --version`
# answer and name the pinned versions, and prints them.
#
# Needs: node (Node.js 20.6+: gemini needs 20, pi 20.6; codex runs under it) and, when something must be installed, npm.
# Checked on node 20.20.2 / npm 11.19.1, where npm 11 skips the packages' install scripts
# ("not yet covered by allowScripts"): claude 2.1.197 ships its native binary in the package
# (bin/claude.exe), so it works without them.
set -euo pipefail

SELF="${BASH_SOURCE[0]}"
[[ "$SELF" == */* ]] || SELF="./$SELF"
HERE="$(cd "${SELF%/*}" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PINS="$HERE/agents/package.json"
PREFIX="${AGENT_CLIS_PREFIX:-$ROOT/tools/agents}"
BIN="$PREFIX/node_modules/.bin"

die() { echo "install-agent-clis: $*" >&2; exit 1; }

command -v node >/dev/null 2>&1 || die "node is not on PATH. Node.js 20.6+ (and npm, to install) is needed for the agent CLIs: codex runs under node (Debian: apt-get install nodejs npm)."
[ -f "$PINS" ] || die "missing $PINS (the pinned versions)."

# Prints "name version" for every pin whose installed version differs (empty output: all good).
stale_pins() {
    node -e '
        const fs = require("fs"), path = require("path");
        const [pins, prefix] = process.argv.slice(1);
        const deps = JSON.parse(fs.readFileSync(pins, "utf8")).dependencies;
        for (const [name, want] of Object.entries(deps)) {
            let have = null;
            try {
                have = JSON.parse(fs.readFileSync(path.join(prefix, "node_modules", name, "package.json"), "utf8")).version;
            } catch (e) {}
            if (have !== want) console.log(`${name} ${want} (installed: ${have || "none"})`);
        }' "$PINS" "$PREFIX"
}

# Prints "name@version" for every pin, one per line.
pin_list() {
    node -e '
        const deps = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).dependencies;
        for (const [name, want] of Object.entries(deps)) console.log(`${name}@${want}`);' "$PINS"
}

mkdir -p "$PREFIX"
# One installer at a time (parallel test sessions, make -j).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$PREFIX/.install.lock"
    flock 9
fi

stale="$(stale_pins)"
if [ -n "$stale" ]; then
    echo "install-agent-clis: installing into $PREFIX:"
    pin_list | sed 's/^/  /'
    command -v npm >/dev/null 2>&1 || die "npm is not on PATH. npm (with Node.js 20.6+) is needed to install the agent CLIs (Debian: apt-get install npm)."
    cp "$PINS" "$PREFIX/package.json"
    npm install --prefix "$PREFIX" --no-audit --no-fund --no-update-notifier \
        || die "npm install failed (the npm registry must be reachable; see the output above)."
    stale="$(stale_pins)"
    [ -z "$stale" ] || die "after npm install, still not at the pinned versions: $stale"
fi

# Verify that each CLI answers and reports its pinned version.
check_version() { # check_version <bin> <pinned version>
    local exe="$BIN/$1" out
    [ -x "$exe" ] || die "$exe is missing after install."
    if ! out="$(timeout 60 "$exe" --version </dev/null 2>&1)"; then
        die "'$exe --version' failed: $out"
    fi
    case "$out" in
        *"$2"*) echo "$1: $out ($exe)" ;;
        *) die "'$exe --version' said '$out', expected version $2." ;;
    esac
}
pinned() { node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).dependencies[process.argv[2]])' "$PINS" "$1"; }

check_version claude "$(pinned @anthropic-ai/claude-code)"
check_version codex "$(pinned @openai/codex)"
check_version gemini "$(pinned @google/gemini-cli)"
check_version pi "$(pinned @mariozechner/pi-coding-agent)"
