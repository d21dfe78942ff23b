// Kernel registry of the host build: SDC_REGISTER(name) makes kernels/<file>.cu's extern "C" entry point `name`
// callable by name with cuLaunchKernel-style arguments (void** args, each pointing at one argument's value).
#pragma once
#include <map>
#include <string>
#include <type_traits>
#include <utility>

namespace sdc_host {
using Thunk = void (*)(void**);
std::map<std::string, Thunk>& registry();

template <typename... P, std::size_t... I>
inline void call_with(void (*fn)(P...), void** args, std::index_sequence<I...>) {
    fn(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}

template <typename... P>
inline void call(void (*fn)(P...), void** args) {
    call_with(fn, args, std::index_sequence_for<P...>{});
}

struct Registrar {
    Registrar(const char* name, Thunk thunk) { registry()[name] = thunk; }
};
}  // namespace sdc_host

#define SDC_REGISTER(name) \
    static sdc_host::Registrar sdc_registrar_##name(#name, [](void** args) { sdc_host::call(name, args); });
