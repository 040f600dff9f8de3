//! PNG encoding of [`RgbImage`]s.

use super::RgbImage;

impl RgbImage {
    /// The image as a PNG file (8-bit RGB, no interlacing).
    ///
    /// Panics when `pixels` is not `width * height * 3` bytes or a side is 0
    /// (images made by the pipeline always fit).
    pub fn to_png(&self) -> Vec<u8> {
        assert_eq!(
            self.pixels.len(),
            self.width * self.height * 3,
            "RgbImage pixels do not match its size"
        );
        let mut out = Vec::new();
        {
            let mut encoder = ::png::Encoder::new(&mut out, self.width as u32, self.height as u32);
            encoder.set_color(::png::ColorType::Rgb);
            encoder.set_depth(::png::BitDepth::Eight);
            let mut writer = encoder.write_header().expect("PNG header of a valid image");
            writer
                .write_image_data(&self.pixels)
                .expect("PNG data of a valid image");
            writer.finish().expect("PNG end of a valid image");
        }
        out
    }
}
