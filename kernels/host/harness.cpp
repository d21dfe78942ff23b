// The host build's launcher: a registry of every kernel (filled by SDC_REGISTER lines that
// sdcguard/golden/hostbuild.py appends to each kernel's translation unit) and one C entry point with
// cuLaunchKernel's argument convention (an array of pointers to the argument values).
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "sdc_host_registry.h"

namespace sdc_host {
std::map<std::string, Thunk>& registry() {
    static std::map<std::string, Thunk> r;
    return r;
}
}  // namespace sdc_host

extern "C" int sdc_host_launch(const char* name, const unsigned* grid, const unsigned* block, void** args) {
    auto& r = sdc_host::registry();
    auto it = r.find(name);
    if (it == r.end()) return 1;
    const sdc_host::Thunk thunk = it->second;
    sdc_host::launch(dim3{grid[0], grid[1], grid[2]}, dim3{block[0], block[1], block[2]}, [&] { thunk(args); });
    return 0;
}

extern "C" void sdc_host_set_fake_sms(unsigned n) { sdc_host::g_fake_sms = n ? n : 1; }

extern "C" int sdc_host_has_kernel(const char* name) { return sdc_host::registry().count(name) ? 1 : 0; }
