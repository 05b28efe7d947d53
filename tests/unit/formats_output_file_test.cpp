// formats/output_file.h: files tandem writes appear whole or not at all; a symlink is written
// through, a device or FIFO is never renamed over, and a failed write (a full disk) is an Error
// even when the stdio buffer only fails at the close.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdlib>
#include <fstream>

#include "core/error.h"
#include "formats/output_file.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(OutputFile, WritesThroughSymlinks) {
  test::TempDir dir("out");
  std::ofstream(dir / "target") << "old";
  fs::create_symlink("target", dir / "link");  // relative, as ln -s makes them
  write_output_file(dir / "link", "new");
  EXPECT_TRUE(fs::is_symlink(dir / "link"));
  EXPECT_EQ(read(dir / "target"), "new");
  fs::create_symlink(dir / "nowhere", dir / "dangling");
  write_output_file(dir / "dangling", "made");
  EXPECT_EQ(read(dir / "nowhere"), "made");
  EXPECT_TRUE(fs::is_symlink(dir / "dangling"));
  fs::create_symlink("loop2", dir / "loop1");
  fs::create_symlink("loop1", dir / "loop2");
  EXPECT_THROW(write_output_file(dir / "loop1", "x"), Error);
}

TEST(OutputFile, RefusesToReplaceWhatIsNotARegularFile) {
  test::TempDir dir("out");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  fs::create_directories(dir / "d");
  fs::create_symlink(dir / "fifo", dir / "to_fifo");
  for (const char* name : {"fifo", "d", "to_fifo"}) {
    try {
      write_output_file(dir / name, "x");
      ADD_FAILURE() << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("refusing to replace it"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(fs::is_fifo(dir / "fifo"));
  EXPECT_TRUE(fs::is_directory(dir / "d"));
  EXPECT_FALSE(fs::exists(dir / "fifo.tmp"));
}

// A file size limit stands for the full disk: writes past it fail (EFBIG) like ENOSPC. The data
// is small enough to sit in the stdio buffer until the close: the close must be checked. Run in a
// child process, which lowers its own limit: exit code 0 when the write was an Error and left no
// file.
[[noreturn]] void write_past_a_size_limit(const fs::path& path) {
  std::signal(SIGXFSZ, SIG_IGN);
  const rlimit limit{100, 100};
  if (setrlimit(RLIMIT_FSIZE, &limit) != 0) std::_Exit(3);
  try {
    write_output_file(path, std::string(1000, 'x'));
    std::_Exit(2);
  } catch (const Error& e) {
    const bool named = std::string(e.what()).find("write failed") != std::string::npos;
    std::_Exit(named && !fs::exists(path) && !fs::exists(path.string() + ".tmp") ? 0 : 4);
  }
}

TEST(OutputFile, AFailedWriteIsAnError) {
  test::TempDir dir("out");
  EXPECT_EXIT(write_past_a_size_limit(dir / "f.json"), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tandem
