# Shows what sshd would run with once the candidate drop-in (read on stdin) is installed,
# without installing it: the drop-in directory is copied to a scratch directory, the candidate
# put in place of the live drop-in, and a copy of the main config made to Include the copy.
# Arguments: sshd binary, main config, drop-in path, keywords to trace.
# Output: "include no" when the main config does not read the drop-in's directory, else
# "setby <file> <line>" for each line in the other files that sets a traced keyword, then
# `sshd -T` of the would-be config. Changes nothing on the node.
set -eu
sshd=$1 main=$2 dropin=$3 keywords=$4
dir=$(dirname "$dropin")
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
mkdir "$tmp/d"
if ! grep -Eiq "^[[:space:]]*Include[[:space:]]+$dir/" "$main"; then
  echo "include no"
  exit 0
fi
for f in "$dir"/*; do
  [ -f "$f" ] && cp -p -- "$f" "$tmp/d/"
done
cat > "$tmp/d/$(basename "$dropin")"
sed "s|$dir/|$tmp/d/|g" "$main" > "$tmp/sshd_config"
for f in "$main" "$dir"/*.conf; do
  [ -f "$f" ] && [ "$f" != "$dropin" ] || continue
  grep -EiH "^[[:space:]]*($keywords)[[:space:]]" "$f" | sed 's/^/setby /' || true
done
"$sshd" -t -f "$tmp/sshd_config"
"$sshd" -T -f "$tmp/sshd_config"
