// C++ functions whose mangled names must come out demangled.
#include <cstdio>
#include <string>
#include <vector>

namespace offcpu {
template <typename T>
struct Queue {
    __attribute__((noinline)) static int drain(const std::vector<T> &items, int limit) {
        return static_cast<int>(items.size()) + limit;
    }
};
__attribute__((noinline)) int wait_for(const std::string &what, double seconds) {
    return static_cast<int>(what.size() + seconds);
}
}  // namespace offcpu

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    int (*drain)(const std::vector<long> &, int) = &offcpu::Queue<long>::drain;
    std::printf("drain %p\n", reinterpret_cast<void *>(drain));
    std::printf("wait_for %p\n", reinterpret_cast<void *>(&offcpu::wait_for));
    std::printf("ready\n");
    char line[256];
    while (std::fgets(line, sizeof line, stdin)) {
    }
    return 0;
}
