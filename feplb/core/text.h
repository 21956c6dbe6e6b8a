// Text for a terminal: user-supplied strings (a model name, a path, a policy) are shown with their
// control characters escaped, so that a trace cannot move the cursor or recolour the terminal.
#pragma once

#include <string>
#include <string_view>

namespace feplb {

// `s` with the C0 controls (tab and newline too), DEL and the C1 controls
// (U+0080..U+009F) written as \xNN or \u00NN, and bytes that are not UTF-8 as \xNN; everything else
// (printable ASCII, valid UTF-8) unchanged.
std::string printable(std::string_view s);

// "[lo, hi]" for an error message, huge bounds as powers of two ("[0, 2^32]", "[1, 2^31-1]").
std::string range_text(double lo, double hi);

}  // namespace feplb
