// core/input_file.h: what every file argument gets. A regular file (or a link to one) is read
// whole; a directory, a device, a FIFO are refused by name without blocking or reading; a file
// over its bound is refused before its bytes are allocated.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "core/error.h"
#include "core/input_file.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(InputFile, ReadsRegularFilesAndLinksToThem) {
  test::TempDir dir("input");
  std::ofstream(dir / "a.txt") << "hello";
  fs::create_symlink(dir / "a.txt", dir / "link");
  EXPECT_EQ(read_input_file(dir / "a.txt", 100), "hello");
  EXPECT_EQ(read_input_file(dir / "link", 100), "hello");
  std::ofstream(dir / "empty");
  EXPECT_EQ(read_input_file(dir / "empty", 100), "");
  // /proc files say 0 bytes: read to the end all the same.
  EXPECT_NE(read_input_file("/proc/self/status", 1 << 20).find("Name:"), std::string::npos);
}

TEST(InputFile, RefusesWhatIsNotARegularFile) {
  test::TempDir dir("input");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);  // opening it must not wait for a writer
  EXPECT_EQ(message_of([&] { read_input_file(dir.path(), 100, "-f"); }),
            "-f " + dir.path().string() + ": not a regular file (a directory)");
  EXPECT_EQ(message_of([&] { read_input_file("/dev/zero", 100, "--rules"); }),
            "--rules /dev/zero: not a regular file (a character device)");
  EXPECT_EQ(message_of([&] { read_input_file(dir / "fifo", 100); }),
            (dir / "fifo").string() + ": not a regular file (a FIFO)");
  EXPECT_NE(message_of([&] { read_input_file(dir / "missing", 100); }).find("cannot open"),
            std::string::npos);
  EXPECT_THROW(InputFile::open("/dev/null"), Error);
}

TEST(InputFile, RefusesFilesOverTheBound) {
  test::TempDir dir("input");
  std::ofstream(dir / "big") << std::string(1000, 'x');
  EXPECT_EQ(read_input_file(dir / "big", 1000).size(), 1000u);
  const std::string m = message_of([&] { read_input_file(dir / "big", 999); });
  EXPECT_NE(m.find("1000 bytes, more than the 999"), std::string::npos) << m;
  // Beyond what fstat says (a /proc file): the bound holds while reading.
  EXPECT_THROW(read_input_file("/proc/self/maps", 16), Error);
}

}  // namespace
}  // namespace tandem
