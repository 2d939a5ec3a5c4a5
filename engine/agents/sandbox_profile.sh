# /etc/profile inside the Run Engine's sandbox (engine/agents/sandbox.py binds this file over the
# host's). A login shell (one CLI runs every command as `bash -lc`; `sh -l`) keeps the PATH the engine
# gave every agent's shell and every gate: the setup's environment first (engine/environments.py),
# then the sandbox's system. The host's /etc/profile would set a PATH of its own, and the
# repository's `python` or `node_modules/.bin` would be "command not found" in one CLI's shell only.
__cp_path="$PATH"
if [ -d /etc/profile.d ]; then
  for __cp_file in /etc/profile.d/*.sh; do
    if [ -r "$__cp_file" ]; then . "$__cp_file"; fi
  done
fi
PATH="$__cp_path"
export PATH
unset __cp_path __cp_file
