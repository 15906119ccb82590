/* A shared library the target loads with dlopen after the symbolizer first read its maps. */
__attribute__((noinline)) int symbols_plugin_func(int x) { return x + 7; }
