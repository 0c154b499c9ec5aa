"""Float64 numpy references, written from shared/EXL3.md and GLM.md (the MLA classes from
transformers 5.17, the truth where GLM.md differs) independently of the Zig code: the tests compare
the library against these, never against itself."""
