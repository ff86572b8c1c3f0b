// Compiled index helper for data_tools (pybind11). See data_tools/index.py for the typed wrapper.
#include <pybind11/pybind11.h>
namespace py = pybind11;

PYBIND11_MODULE(_helpers, m) {
    m.doc() = "ernie-mtl compiled index helper";
    m.attr("VERSION") = "0";
}
