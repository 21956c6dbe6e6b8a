// Reading and writing files: file_input.h (inputs: regular files, bounded, chunked) and
// file_output.h (outputs: checked together, written whole or not at all).
#pragma once

#include "feplb/core/file_input.h"
#include "feplb/core/file_output.h"
