// Writing output files, the one way every command does it: a command names all its inputs and
// outputs first (FileSet) and they are checked together before anything is written; then each
// output is written whole (write_file) so that a failure leaves nothing half-written behind.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "feplb/core/error.h"

namespace feplb {

// A command's input and output paths, compared by identity (device and inode; for an output that
// does not exist yet, its path with every symlink resolved). "-" is standard input as an input
// and standard output as an output. Empty paths are ignored (an option not given).
class FileSet {
 public:
  explicit FileSet(bool force) : force_(force) {}

  // A file the command reads; `role` names it in errors ("the input trace", "the --placement
  // file").
  void input(std::string role, std::string path);
  // A directory whose files the command reads ("the --priors directory"): no output may be
  // written inside it.
  void input_dir(std::string role, std::string path);
  // A file the command writes; `flag` names it in errors ("--json").
  void output(std::string flag, std::string path);

  // Throws InputError, one line naming the path, unless every output may be written: none is an
  // input or inside an input directory, no two name the same file, none is a directory or in a
  // missing directory, and none exists unless --force (special files such as /dev/null, FIFOs and
  // standard output excepted).
  void check() const;

 private:
  struct Entry {
    std::string role;  // inputs: what it is; outputs: the flag
    std::string path;
  };
  bool force_;
  std::vector<Entry> inputs_, input_dirs_, outputs_;
};

// Writes `content` to `path`. "-", /dev/stdout, /dev/stderr, /dev/fd/N and special files (devices,
// FIFOs) are written directly. A regular file (or a symlink to one, which is written through,
// never replaced) is written to a unique temporary file in its directory, flushed, checked and
// renamed over it; on any failure the temporary file is removed and the target left as it was.
// Unless `overwrite`, an existing regular file is an InputError ("PATH: exists; pass --force to
// overwrite"). Every failure is an InputError naming the path and the reason.
void write_file(const std::string& path, std::string_view content, bool overwrite);

// Flushes standard output; InputError "standard output: write failed (...)" if anything written
// to it was lost (a full disk, a closed pipe, /dev/full).
void flush_stdout();

}  // namespace feplb
