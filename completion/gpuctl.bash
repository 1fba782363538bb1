# bash completion for gpuctl(1), installed as
# /usr/share/bash-completion/completions/gpuctl.
#
# Completes the commands and subcommands, each command's flags, the values
# of --policy, and files where a command takes one (*.txtpb for job encode,
# *.pb for plan, submit and job show). Names that only the daemon knows
# (vdevs, tenants, datasets, devices, job ids) come from gpuctl --json
# itself, on the socket the command line names (--socket, else
# $GPUSHARE_SOCKET, else the default); when the daemon does not answer
# within 2 seconds, or refuses, they complete to nothing. The lists of
# commands and flags are checked against gpuctl's --help by
# tests/integration/test_completion.sh.

# _gpuctl_names PROG SOCKARGS... -- KEY ARGS...: the values of "KEY" in the
# JSON the daemon answers to `gpuctl --json ARGS`.
_gpuctl_names() {
  local prog=$1 key sock=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sock+=("$1"); shift; done
  shift
  key=$1
  shift
  local out
  out=$(timeout 2 "$prog" "${sock[@]}" --json "$@" 2>/dev/null) || return 0
  # One line of compact JSON; names are [A-Za-z0-9_.-], ids are numbers.
  printf '%s\n' "$out" | grep -o "\"$key\":\"\\?[A-Za-z0-9_.:-]*" | sed "s/^\"$key\":\"\\?//"
}

_gpuctl_files() { # PATTERN: matching files and every directory
  local IFS=$'\n'
  compopt -o filenames 2>/dev/null
  COMPREPLY=($(compgen -d -- "$cur"))
  if [ -n "$1" ]; then
    COMPREPLY+=($(compgen -f -X "!$1" -- "$cur"))
  else
    COMPREPLY+=($(compgen -f -- "$cur"))
  fi
}

_gpuctl() {
  local prog=$1 cur=${COMP_WORDS[COMP_CWORD]} prev=
  [ "$COMP_CWORD" -gt 0 ] && prev=${COMP_WORDS[COMP_CWORD - 1]}
  command -v -- "$prog" >/dev/null 2>&1 || prog=gpuctl
  COMPREPLY=()
  # --flag=value: bash splits it into "--flag" "=" "value"
  if [ "$cur" = "=" ]; then
    cur=
  elif [ "$prev" = "=" ] && [ "$COMP_CWORD" -gt 1 ]; then
    prev=${COMP_WORDS[COMP_CWORD - 2]}
  fi

  local groups="vdev tenant quota dataset job"
  local commands="devices vdev tenant quota dataset job plan submit status list watch
    cancel logs fetch memory usage slurm-gres metrics version help"
  local globals="--socket --json --help"
  # Value-taking flags of every command (and the global --socket).
  local valued=" --socket --device --memory --compute --policy --tenant --uid --gid
    --max-running --max-queued --vdev --priority --output -o --since --unit --format
    --vocab-size "

  # Walk the words before the cursor: global options, the command, its
  # positional arguments.
  local i w cmd= npos=0 sock=() skip=0
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    if [ "$skip" -eq 1 ]; then
      skip=0
      [ "$w" = "=" ] && skip=1
      continue
    fi
    case $w in
    --socket)
      if [ "${COMP_WORDS[i + 1]}" = "=" ]; then
        sock=(--socket "${COMP_WORDS[i + 2]}")
      else
        sock=(--socket "${COMP_WORDS[i + 1]}")
      fi
      skip=1
      continue
      ;;
    -*)
      [[ "$valued" == *" $w "* ]] && skip=1
      continue
      ;;
    esac
    if [ -z "$cmd" ]; then
      cmd=$w
    elif [[ " $groups " == *" $cmd "* ]] && [[ "$cmd" != *" "* ]]; then
      cmd="$cmd $w"
    else
      npos=$((npos + 1))
    fi
  done
  [ -n "$cmd" ] && [ "${cmd%% *}" = help ] && cmd=help

  # A flag's value.
  case $prev in
  --socket | --output | -o)
    _gpuctl_files ""
    return
    ;;
  --policy)
    COMPREPLY=($(compgen -W "preallocate growth" -- "$cur"))
    return
    ;;
  --device)
    COMPREPLY=($(compgen -W "$(_gpuctl_names "$prog" "${sock[@]}" -- name devices)" -- "$cur"))
    return
    ;;
  --tenant)
    COMPREPLY=($(compgen -W "$(_gpuctl_names "$prog" "${sock[@]}" -- name tenant list)" -- "$cur"))
    return
    ;;
  --vdev)
    COMPREPLY=($(compgen -W "$(_gpuctl_names "$prog" "${sock[@]}" -- name vdev list)" -- "$cur"))
    return
    ;;
  --format)
    COMPREPLY=($(compgen -W "idx npy text tokens" -- "$cur"))
    return
    ;;
  --memory | --compute | --uid | --gid | --max-running | --max-queued | --priority | --since | --vocab-size)
    return
    ;;
  esac

  local flags=
  case $cmd in
  "vdev create") flags="--device --memory --compute --policy --tenant" ;;
  "vdev set") flags="--memory --compute --policy" ;;
  "tenant create") flags="--uid --gid --memory --compute --max-running --max-queued" ;;
  "quota set") flags="--memory --compute --max-running --max-queued" ;;
  "dataset add") flags="--format --vocab-size" ;;
  "job encode") flags="-o --output" ;;
  plan) flags="--vdev" ;;
  submit) flags="--watch --vdev --priority" ;;
  list) flags="--all" ;;
  fetch) flags="-o --output --checkpoint" ;;
  usage) flags="--tenant --since" ;;
  slurm-gres) flags="--unit" ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$flags $globals" -- "$cur"))
    return
  fi

  case $cmd in
  "" | help)
    COMPREPLY=($(compgen -W "$commands" -- "$cur"))
    ;;
  vdev) COMPREPLY=($(compgen -W "create list delete set" -- "$cur")) ;;
  tenant) COMPREPLY=($(compgen -W "create list delete" -- "$cur")) ;;
  quota) COMPREPLY=($(compgen -W "set show" -- "$cur")) ;;
  dataset) COMPREPLY=($(compgen -W "add list rm" -- "$cur")) ;;
  job) COMPREPLY=($(compgen -W "encode show" -- "$cur")) ;;
  "vdev delete" | "vdev set")
    [ "$npos" -eq 0 ] &&
      COMPREPLY=($(compgen -W "$(_gpuctl_names "$prog" "${sock[@]}" -- name vdev list)" -- "$cur"))
    ;;
  "tenant delete" | "quota set" | "quota show")
    [ "$npos" -eq 0 ] &&
      COMPREPLY=($(compgen -W "$(_gpuctl_names "$prog" "${sock[@]}" -- name tenant list)" -- "$cur"))
    ;;
  "dataset rm")
    [ "$npos" -eq 0 ] &&
      COMPREPLY=($(compgen -W "$(_gpuctl_names "$prog" "${sock[@]}" -- name dataset list)" -- "$cur"))
    ;;
  "dataset add")
    [ "$npos" -ge 1 ] && _gpuctl_files ""
    ;;
  "job encode")
    [ "$npos" -eq 0 ] && _gpuctl_files "*.txtpb"
    ;;
  "job show" | plan | submit)
    [ "$npos" -eq 0 ] && _gpuctl_files "*.pb"
    ;;
  status | logs | fetch | memory)
    [ "$npos" -eq 0 ] &&
      COMPREPLY=($(compgen -W "$(_gpuctl_names "$prog" "${sock[@]}" -- id list --all)" -- "$cur"))
    ;;
  watch | cancel)
    [ "$npos" -eq 0 ] &&
      COMPREPLY=($(compgen -W "$(_gpuctl_names "$prog" "${sock[@]}" -- id list)" -- "$cur"))
    ;;
  esac
}
complete -F _gpuctl gpuctl
