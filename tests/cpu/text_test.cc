// User text on the terminal and in SVG: control characters shown escaped, XML special characters
// as entities, valid UTF-8 kept.
#include "feplb/core/text.h"

#include <gtest/gtest.h>

#include <string>

#include "feplb/sim/svg.h"

namespace feplb {
namespace {

TEST(Printable, EscapesControlCharactersAndStrayBytes) {
  EXPECT_EQ(printable("glm5-128e"), "glm5-128e");
  EXPECT_EQ(printable("\x1b[31mred\x1b[0m"), "\\x1b[31mred\\x1b[0m");
  EXPECT_EQ(printable("a\nb\tc\x7f"), "a\\x0ab\\x09c\\x7f");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");  // é €
  EXPECT_EQ(printable("\xc2\x9b"), "\\u009b");                                   // C1 CSI
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");                                // not UTF-8
  EXPECT_EQ(printable("\xe2\x82"), "\\xe2\\x82");                                // truncated
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
}

TEST(XmlEscape, NoMarkupSurvives) {
  EXPECT_EQ(xml_escape("a&b </text><script>\"'"),
            "a&amp;b &lt;/text&gt;&lt;script&gt;&quot;&apos;");
  EXPECT_EQ(xml_escape("\x1b"), "\\x1b");
  Svg svg(10, 10);
  svg.text(0, 0, "</text><script>alert(1)</script>");
  const std::string out = svg.done();
  EXPECT_EQ(out.find("<script"), std::string::npos) << out;
}

}  // namespace
}  // namespace feplb
