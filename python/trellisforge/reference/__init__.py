"""Float64 numpy references, written from shared/EXL3.md and GLM.md independently of the Zig
code: the tests compare the library against these, never against itself."""
