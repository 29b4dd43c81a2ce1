#!/usr/bin/env bash
# Writes the command-line reference (docs/cli.md) from the built binary's --help, so that it
# cannot drift from the flags: `./run docs` calls it; tests/cli_docs_test.cpp checks that
# docs/cli.md is what it writes.
#
#   docs/write_cli_reference.sh COCONUT_BINARY OUT.md
set -euo pipefail
binary=${1:?usage: docs/write_cli_reference.sh COCONUT_BINARY OUT.md}
out=${2:?usage: docs/write_cli_reference.sh COCONUT_BINARY OUT.md}
# The subcommands in the order --help lists them (the lines after "Subcommands:").
mapfile -t commands < <("$binary" --help | awk '/^Subcommands:/ {listed = 1; next} listed && NF {print $1}')
{
  echo "# Command-line reference"
  echo
  echo "Generated from \`coconut SUBCOMMAND --help\` by \`docs/write_cli_reference.sh\` (\`./run docs\`); a test"
  echo "fails when it is not current."
  echo
  for command in "${commands[@]}"; do echo "- [$command](#$command)"; done
  for command in "${commands[@]}"; do
    echo
    echo "## $command"
    echo
    echo '```'
    "$binary" "$command" --help | sed -e 's/[[:space:]]*$//' -e "s|^Usage: [^ ]*coconut|Usage: coconut|"
    echo '```'
  done
} >"$out.tmp"
mv "$out.tmp" "$out"
