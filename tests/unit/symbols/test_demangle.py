from offcpu_exporter.symbols.demangle import demangle


def test_cxx() -> None:
    assert (
        demangle("_ZNSt6vectorIiSaIiEE9push_backERKi")
        == "std::vector<int, std::allocator<int> >::push_back(int const&)"
    )


def test_rust_legacy_without_hash() -> None:
    assert demangle("_ZN4core3fmt5write17h8b7d2c5a1f3e4d6cE") == "core::fmt::write"


def test_rust_v0() -> None:
    assert demangle("_RNvCs1234_7mycrate3foo") == "mycrate::foo"


def test_plain_and_invalid_names_unchanged() -> None:
    assert demangle("main") == "main"
    assert demangle("_Zgarbage") == "_Zgarbage"
    assert demangle("_R!!") == "_R!!"
