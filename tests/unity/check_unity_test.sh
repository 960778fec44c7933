#!/usr/bin/env bash
# The unity-build name check (scripts/check_unity.py) on fixture trees written here: file-local
# helpers of one name in two files of a folder fail (the overload a unity build would mix in),
# whether `namespace {` or `static`, and so does a file-scope `using namespace`; distinct names,
# other folders and overloads declared for the whole library pass. Then this tree.
set -u
check="python3 $1/scripts/check_unity.py"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fails=0

put() {  # put FILE LINE...: writes FILE (under $d/TREE) with the given lines
  mkdir -p "$(dirname "$d/$1")"
  local f=$1
  shift
  printf '%s\n' "$@" > "$d/$f"
}
expect() {  # expect RC NAME ROOT [TEXT]: runs the checker on ROOT, compares exit status and output
  $check --root "$3" > "$d/out" 2>&1
  local rc=$?
  if [ "$rc" != "$1" ] || { [ -n "${4:-}" ] && ! grep -qF -- "$4" "$d/out"; }; then
    echo "FAIL $2: exit $rc, want $1${4:+, output with '$4'}"; sed 's/^/  /' "$d/out"; fails=$((fails + 1))
  else
    echo "ok   $2"
  fi
}

anon() {  # anon FILE SIGNATURE: FILE defines SIGNATURE in an anonymous namespace
  put "$1" 'namespace moeshard {' 'namespace {' '' "$2 {" '  return {};' '}' '' '}  // namespace' \
    'void Use() {}' '}  // namespace moeshard'
}
anon hijack/tests/a_test.cc 'Proto Chunk(int64_t seq, std::vector<int32_t> tokens)'
anon hijack/tests/b_test.cc 'Proto Chunk(int64_t seq, int n)'
expect 1 "file-local overloads in one folder" "$d/hijack" "Chunk: tests/a_test.cc:4 (file-local), tests/b_test.cc:4 (file-local)"

put static/lib/a.cc 'static int Parse(const char* s) {' '  return 0;' '}'
put static/lib/b.cc 'double Parse(double x)' '{' '  return x;' '}'
expect 1 "a static helper against a library function" "$d/static" "Parse: lib/a.cc:1 (file-local), lib/b.cc:1"

anon apart/bench/a.cc 'int Main(int argc, char** argv)'
anon apart/tests/b.cc 'int Main(int argc, char** argv)'
anon apart/tests/c.cc 'int RunMain(int argc, char** argv)'
put apart/lib/wire.cc 'void ToProto(const A& a, P* p) {' '}' 'void ToProto(const B& b, Q* q) {' '}'
put apart/lib/more.cc 'void ToProto(const C& c, R* r) {' '}' 'int Declared(int x);' 'Foo::Foo() {' '}' \
  'absl::Status Foo::Run(int n) {' '  return {};' '}'
put apart/lib/run.cc 'absl::Status Run(int n);' 'TEST(FooTest, Run) {' '}'
expect 0 "distinct names, other folders, library overloads" "$d/apart" "check_unity: ok"

put using/lib/a.cc 'namespace moeshard {' 'using namespace gpu;  // reaches b.cc' '}  // namespace moeshard'
put using/lib/b.cc 'using namespace std::chrono_literals;' 'int F() {' '  return 1;' '}'
expect 1 "a file-scope using namespace (literals allowed)" "$d/using" "lib/a.cc:2: a file-scope \`using namespace\`"

expect 0 "this tree" "$1" "check_unity: ok"
[ "$fails" -eq 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
