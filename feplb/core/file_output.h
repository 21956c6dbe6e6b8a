// Writing output files, the one way every command does it: a command names all its inputs and
// outputs first (FileSet) and they are checked together before any work; then it stages each
// output's content and commits them together: all of its outputs are written, or none.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "feplb/core/error.h"

namespace feplb {

// A command's input and output paths, compared by identity (device and inode; for an output that
// does not exist yet, its path with every symlink resolved). "-" is standard input as an input
// and standard output as an output. Empty paths are ignored (an option not given).
//
// An output is one of: a stream ("-", /dev/stdout, /dev/stderr, /dev/fd/N), a special file (a
// device such as /dev/null, or a FIFO), or a regular file, existing or not (a symlink to one is
// written through, never replaced).
class FileSet {
 public:
  explicit FileSet(bool force) : force_(force) {}
  ~FileSet();
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;

  // A file the command reads; `role` names it in errors ("the input trace", "the --placement
  // file").
  void input(std::string role, std::string path);
  // A directory whose files the command reads ("the --priors directory"): no output may be
  // written inside it.
  void input_dir(std::string role, std::string path);
  // A file the command writes; `flag` names it in errors ("--json").
  void output(std::string flag, std::string path);

  // Whether an output is standard output ("-", /dev/stdout, /dev/fd/1): the command's tables and
  // notes then go to standard error, so that standard output carries the data alone.
  bool writes_stdout() const;

  // Throws InputError, one line naming the path, unless every output may be written: none is an
  // input or inside an input directory, no two name the same file or stream (two outputs on
  // standard output would be one stream of both), none is a directory or in a
  // missing directory, none exists unless --force (special files and streams excepted), each
  // regular file's directory takes a new file (one is created there and removed: a read-only
  // directory is named now, before any work), and each special file opens for writing without
  // waiting (a FIFO no process reads is refused; it stays open until commit(), so that its reader
  // sees one stream). Call it before the work, once every output is named.
  void check();

  // Keeps `content` for the output `path` (named by output() before); nothing is written yet.
  void stage(const std::string& path, std::string content);

  // Writes every staged output, all of them or none: each regular file goes to a temporary file
  // (a short name, so a 255-byte file name works) in its directory, written and flushed; then
  // the streams and special files are written; only then are the temporary files renamed into
  // place (a file replaced under --force is kept aside until the last rename succeeded). On any
  // failure (a full disk, a file size limit, a closed pipe, a file that appeared meanwhile),
  // InputError naming the path and the reason and saying what was written: "nothing was written"
  // unless a stream had already been written. A signal that ends the process meanwhile (SIGINT,
  // SIGTERM, SIGHUP, where the process has no handler of its own for it) first removes the
  // temporary files and undoes the outputs already placed. Returns the staged paths, in the order
  // staged.
  std::vector<std::string> commit();

 private:
  struct Entry {
    std::string role;  // inputs: what it is; outputs: the flag
    std::string path;
  };
  struct Output {
    Entry entry;
    int fd = -1;  // a special file, opened by check()
    std::optional<std::string> content;
    size_t staged_order = 0;
  };
  bool force_;
  bool checked_ = false;
  size_t staged_ = 0;
  std::vector<Entry> inputs_, input_dirs_;
  std::vector<Output> outputs_;
};

// Writes `content` to `path`: FileSet's check() and commit() for one output. Unless `overwrite`,
// an existing regular file is an InputError ("PATH: exists; pass --force to overwrite"). Every
// failure is an InputError naming the path and the reason; the target is left as it was.
void write_file(const std::string& path, std::string_view content, bool overwrite);

// Flushes standard output; InputError "standard output: write failed (...)" if anything written
// to it was lost (a full disk, a closed pipe, /dev/full).
void flush_stdout();

}  // namespace feplb
