package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// Bash and zsh complete by asking the binary itself for the words at each TAB (urfave/cli's
// --generate-bash-completion, on with App.EnableBashCompletion), so their scripts never go
// stale; the scripts are urfave/cli's, bound to the name kvmesh.
const (
	bashCompletion = `# kvmesh completion for bash: source <(kvmesh completion bash)
_kvmesh_complete() {
  local cur="${COMP_WORDS[COMP_CWORD]}" opts
  local words=("${COMP_WORDS[@]:0:COMP_CWORD}")
  if [[ "$cur" == -* ]]; then
    opts=$("${words[@]}" "$cur" --generate-bash-completion 2>/dev/null)
  else
    opts=$("${words[@]}" --generate-bash-completion 2>/dev/null)
  fi
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o bashdefault -o default -F _kvmesh_complete kvmesh
`
	zshCompletion = `#compdef kvmesh
# kvmesh completion for zsh: kvmesh completion zsh > "${fpath[1]}/_kvmesh"
_kvmesh() {
  local -a opts
  local cur=${words[-1]}
  if [[ "$cur" == -* ]]; then
    opts=("${(@f)$(${words[@]:0:#words[@]-1} ${cur} --generate-bash-completion)}")
  else
    opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion)}")
  fi
  if [[ "${opts[1]}" != "" ]]; then
    _describe 'values' opts
  else
    _files
  fi
}
compdef _kvmesh kvmesh
`
)

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script (bash, zsh or fish)",
		ArgsUsage: "bash|zsh|fish",
		Action: func(c *cli.Context) error {
			var script string
			switch shell := c.Args().First(); shell {
			case "bash":
				script = bashCompletion
			case "zsh":
				script = zshCompletion
			case "fish":
				// Fish takes a static script of every command and flag.
				s, err := c.App.ToFishCompletion()
				if err != nil {
					return fmt.Errorf("completion: %w", err)
				}
				script = s
			default:
				return fmt.Errorf("completion: want bash, zsh or fish, not %q", shell)
			}
			_, err := fmt.Fprint(c.App.Writer, script)
			return err
		},
	}
}
