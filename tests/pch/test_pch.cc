// The library that owns the tests' precompiled header (tests/CMakeLists.txt): every gtest target
// under tests/ reuses it. Nothing here is linked into a test.
namespace moeshard::test_pch {
int Anchor() { return 0; }
}  // namespace moeshard::test_pch
